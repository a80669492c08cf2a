"""The optimizers of `lpes-search --optimizer`: one registered class per optimizer, as the export targets are.

An optimizer says, in one class, what options.py, the CLI and the search loop (run.py) need of it:

- `name` (its `--optimizer` value) and `order` (its place among the choices);
- `verdicts` / `likelihood`: whether it climbs right/wrong verdicts (`--objective accuracy`,
  `answer-accuracy`) and a likelihood (`logprob`, `answer-logprob`); `check` refuses the others
  in one line, before any model is loaded, ending with `why`;
- `population(degree)`: candidates per generation when `--population` is not given;
- `build(...)`: the search object of a plan, whose `run(state)` runs the generations.

The built-in ones are the GA (search/ga.py), CMA-ES (search/cma.py) and Adam on the curve
(search/gradient.py), each module's class registering itself when the registry first loads them;
another (in a test, say) is one more class decorated with `@register`. This module imports none of
them, so the names are known without torch, and none of them imports another's private names.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from lpes.foundation.errors import LpesError
from lpes.search.objective import LIKELIHOODS

# The modules that hold the built-in optimizers, loaded (and so registered) on the registry's first use.
BUILTIN_MODULES = ("lpes.search.ga", "lpes.search.cma", "lpes.search.gradient")


class Optimizer:
    """One `--optimizer`. Subclass, set the class attributes, decorate with `@register`."""

    name: ClassVar[str]
    order: ClassVar[int] = 100  # its place among --optimizer's choices (and in a refusal's list of them)
    verdicts: ClassVar[bool] = True  # climbs right/wrong verdicts: --objective accuracy, answer-accuracy
    likelihood: ClassVar[bool] = False  # climbs the gold answer's likelihood: --objective logprob, answer-logprob
    why: ClassVar[str] = ""  # why it does not climb the other kind (the last words of `check`'s refusal)

    @classmethod
    def population(cls, degree: int) -> int:
        """Candidates per generation when --population is not given, for a curve of `degree`."""
        raise NotImplementedError

    @classmethod
    def check(cls, options: Any) -> None:
        """LpesError (one line) for `SearchOptions` this optimizer cannot run with; reads no model."""
        objective = options.objective
        if objective in LIKELIHOODS and not cls.likelihood:
            climbers = " or ".join(name for name, other in registry().items() if other.likelihood)
            raise LpesError(f"--objective {objective} works with --optimizer {climbers}; {cls.why}")
        if objective not in LIKELIHOODS and not cls.verdicts:
            raise LpesError(f"--optimizer {cls.name} climbs the gold answer's likelihood: add --objective "
                            f"{' or '.join(LIKELIHOODS)} ({cls.why})")

    @classmethod
    def build(cls, plan: Any, options: Any, evaluator: Any, settings: Any, on_generation: Any,
              step_progress: Any) -> Optimizer:
        """The search of `plan` (search/plan.py `SearchPlan`) under `options`, scoring by `evaluator`:
        `on_generation(state)` after every generation, `step_progress` opens each step's progress line."""
        raise NotImplementedError

    def run(self, state: Any = None) -> Any:
        """Run to the last generation from `state` (a resumed checkpoint's `SearchState`) or from scratch."""
        raise NotImplementedError


_REGISTRY: dict[str, type[Optimizer]] = {}
_BUILTINS_LOADED = False


def register(cls: type[Optimizer]) -> type[Optimizer]:
    """Class decorator: make `cls` an `--optimizer` under `cls.name`."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name or name != name.strip() or "," in name:
        raise ValueError(f"bad optimizer name {name!r}")
    _REGISTRY[name] = cls
    return cls


def registry() -> dict[str, type[Optimizer]]:
    """Every registered optimizer, in order."""
    _load_builtins()
    return dict(sorted(_REGISTRY.items(), key=lambda item: (item[1].order, item[0])))


def optimizer(name: str) -> type[Optimizer]:
    """The optimizer registered as `name`; LpesError (one line, naming every one) for any other."""
    known = registry()
    if name not in known:
        raise LpesError(f"--optimizer must be one of {', '.join(known)}, got {name!r}")
    return known[name]


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    _BUILTINS_LOADED = True
