"""--optimizer is search/optimizers.py's registry: a class registered there is checked, offered and run like the
built-in ones (the GA, CMA-ES, gradient), an unknown name is refused in one line, and no optimizer's module
imports another's private names."""

import ast
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lpes.foundation.errors import LpesError
from lpes.search import optimizers
from lpes.search.cma import CMASearch, LogprobCMASearch
from lpes.search.ga import GeneticSearch
from lpes.search.genome import ScaleGrid, SearchSpace
from lpes.search.gradient import GradientSearch
from lpes.search.options import SearchOptions, check_options, resolve_population

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def made_up(monkeypatch):
    """A made-up optimizer of likelihoods alone, registered for one test (the registry restored after it)."""
    monkeypatch.setattr(optimizers, "_REGISTRY", dict(optimizers.registry()))

    @optimizers.register
    class Hillclimb(optimizers.Optimizer):
        name = "hillclimb"
        verdicts, likelihood = False, True
        why = "it climbs a slope"
        built: list = []

        @classmethod
        def population(cls, degree):
            return 3 * degree

        @classmethod
        def build(cls, plan, options, evaluator, settings, on_generation, step_progress):
            cls.built.append((plan, options, evaluator, settings, on_generation, step_progress))
            return cls()

    return Hillclimb


def test_a_registered_optimizer_is_checked_offered_and_dispatched(made_up):
    from lpes.search.run import search_loop
    from lpes.search_cli import build_parser

    assert list(optimizers.registry()) == ["ga", "cmaes", "gradient", "hillclimb"]
    options = SearchOptions(optimizer="hillclimb", objective="logprob", degree=2)
    grid, settings = check_options(options)
    assert resolve_population(options) == settings.population == 6  # its own default population
    assert build_parser().parse_args(["m", "--out", "b.json", "--optimizer", "hillclimb"]).optimizer == "hillclimb"
    with pytest.raises(LpesError, match=r"^--optimizer hillclimb climbs the gold answer's likelihood: add "
                                        r"--objective logprob or answer-logprob \(it climbs a slope\)$"):
        check_options(SearchOptions(optimizer="hillclimb", objective="accuracy"))
    with pytest.raises(LpesError, match=r"^--objective logprob works with --optimizer cmaes or gradient or "
                                        r"hillclimb; the GA races exact right/wrong counts$"):
        check_options(SearchOptions(optimizer="ga", objective="logprob"))

    plan, evaluator = SimpleNamespace(), object()
    found = search_loop(plan, options, evaluator, settings, print, None)
    assert isinstance(found, made_up) and made_up.built == [(plan, options, evaluator, settings, print, None)]


def test_an_unknown_optimizer_is_refused_in_one_line_naming_every_registered_one(made_up, capsys):
    from lpes.search_cli import main

    with pytest.raises(LpesError) as refused:
        check_options(SearchOptions(optimizer="adam"))
    assert str(refused.value) == "--optimizer must be one of ga, cmaes, gradient, hillclimb, got 'adam'"
    with pytest.raises(SystemExit):
        main(["m", "--out", "b.json", "--optimizer", "adam"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "invalid choice: 'adam'" in error and "'ga', 'cmaes', 'gradient', 'hillclimb'" in error


def test_the_built_in_optimizers_are_built_as_before():
    """What search_loop ran before the registry: the GA, CMA-ES (on a likelihood its logprob search), Adam."""
    from lpes.search.run import search_loop

    plan = SimpleNamespace(space=SearchSpace(ScaleGrid.parse("1:4:1"), num_layers=4, degree=2),
                           weights=[0.5, 0.5], lengths=[(10, 12), (20, 22)])
    evaluator = SimpleNamespace(num_examples=2, forward_tokens=0)
    built = {}
    for name, objective in [("ga", "accuracy"), ("cmaes", "accuracy"), ("cmaes", "logprob"),
                            ("gradient", "logprob")]:
        options = SearchOptions(optimizer=name, objective=objective, learning_rate=0.2, batch_size=1)
        _, settings = check_options(options)
        built[name, objective] = search_loop(plan, options, evaluator, settings, None, None)
    assert [type(b) for b in built.values()] == [GeneticSearch, CMASearch, LogprobCMASearch, GradientSearch]
    assert built["cmaes", "logprob"].weights == plan.weights
    gradient = built["gradient", "logprob"]
    assert (gradient.gradient.learning_rate, gradient.batches) == (0.2, [[1], [0]])
    assert {n: c.population(3) for n, c in optimizers.registry().items()} == {"ga": 32, "cmaes": 6, "gradient": 6}


def test_the_optimizer_names_are_known_without_torch():
    """lpes-search refuses a bad flag before torch loads: the registry and its optimizers import none of it."""
    code = ("import sys\nfrom lpes.search.optimizers import registry\nprint(','.join(registry()), "
            "sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["ga,cmaes,gradient", "[]"], done.stdout + done.stderr


def test_no_search_module_imports_another_modules_private_names():
    crossed = [f"{path.name}:{node.lineno} imports {node.module}.{alias.name}"
               for path in sorted((ROOT / "search").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lpes.")
               for alias in node.names if alias.name.startswith("_")]
    assert crossed == []


def test_a_bad_name_is_not_registered():
    class Nameless(optimizers.Optimizer):
        name = "a,b"

    with pytest.raises(ValueError, match="bad optimizer name"):
        optimizers.register(Nameless)
    assert "a,b" not in optimizers.registry()
