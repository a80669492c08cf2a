"""Gradient ascent on the curve (`--optimizer gradient`): the gold answer's likelihood, climbed by autograd.

Generation -1 scans the uniform curves by the objective (forward passes only) and the descent
starts at the best, so the curve found can only match or beat it on calibration. The curve's
control points sit at evenly spaced layer positions x_k = k (L - 1) / d (so layer h
is read at t_h = h / (L - 1)); what moves is each control point's scale, as u_k = log s_k. The
per-layer scales are linear in the control scales, s = W exp(u) (W: the Bernstein weights of
lpes.foundation.bezier at each layer, the function a spec applies), so dJ/du = exp(u) * W^T dJ/ds, and
dJ/ds comes from autograd through the one per-layer RoPE (converter/lpes_rope.py, with the
model's weights frozen; `reference.apply_differentiable`).

Each generation is one pass over the calibration examples in fixed mini-batches of
`--batch-size` (grouped by length, the same for the whole search): for each batch, the gradient
of its share of the objective J (search/objective.py: the gold-position-weighted mean
log-likelihood) by one forward and one backward pass, then one Adam step on u, projected onto the
scale grid's bounds [min, max]. So a pass over N examples in batches of B takes N / B steps for
the cost of one full gradient (the full-batch version took one step per pass, and on
lpes-tiny-induction never left the unscaled model: bench/RESULTS.md, issue 33). The pass ends
with J of the point reached, scored exactly on every example (forward only, spread over the
replicas): the best curve by J so far is kept (the starting point included), and a pass that
does not raise J is taken back: the next one starts again from the best point with half the
learning rate and fresh moments. Patience stops the search once J has not risen for K
generations. A batch's gradient is computed on one replica at a time, so any number of replicas
takes the same steps (replicas speed up the scoring, not the steps).

The state (u, Adam's moments, the best) is written to the checkpoint after every generation
as exact JSON floats; resuming continues the same steps bit for bit. A NaN or infinite
gradient stops the search at that generation with the last good checkpoint kept.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lpes.foundation.bezier import layer_scales
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme
from lpes.search.ga import GASettings, Scored, SearchState
from lpes.search.genome import Curve, SearchSpace
from lpes.search.objective import LIKELIHOODS, weighted
from lpes.search.optimizers import Optimizer, register

NAME = "gradient"
# 2: one Adam step per mini-batch. A checkpoint of another version would resume other steps: refused.
VERSION = 2
LEARNING_RATE = 0.1  # Adam's step in log-scale: about 10% per mini-batch at most, in each control scale
BETAS = (0.9, 0.999)
EPSILON = 1e-8
# J rising by less than this (in nats per answer token) is not an improvement for patience.
MIN_GAIN = 1e-4


@dataclass(frozen=True)
class GradientSettings:
    learning_rate: float = LEARNING_RATE
    batch_size: int = 8


@register
class GradientSearch(Optimizer):
    """Adam on the control points' log-scales; checkpoints, patience and progress as the other optimizers."""

    name = NAME
    order = 30
    verdicts, likelihood = False, True
    why = "right/wrong verdicts have no gradient"

    @classmethod
    def population(cls, degree: int) -> int:
        """Adam keeps no population; the spec records this one (6, what it has always recorded)."""
        return 6

    @classmethod
    def build(cls, plan, options, evaluator, settings, on_generation, step_progress) -> GradientSearch:
        return cls(plan.space, evaluator, settings, plan.weights, on_generation, step_progress,
                   GradientSettings(options.learning_rate, options.batch_size), [n for n, _ in plan.lengths])

    def __init__(self, space: SearchSpace, evaluator, settings: GASettings, weights: list[float],
                 on_generation: Callable[[SearchState], None] | None = None, step_progress=None,
                 gradient: GradientSettings = GradientSettings(), lengths: list[int] | None = None):
        self.space, self.evaluator, self.settings, self.weights = space, evaluator, settings, weights
        self.on_generation, self.step_progress, self.gradient = on_generation, step_progress, gradient
        layers, degree = space.num_layers, space.degree
        self.x = [k * (layers - 1) / degree for k in range(degree + 1)]
        self.basis = _basis(self.x, layers)  # [L, d + 1]: s = basis @ control scales
        grid = space.grid.values
        self.bounds = (math.log(min(grid)), math.log(max(grid)))
        self.batches = _fixed_batches(lengths or [1] * evaluator.num_examples, gradient.batch_size)

    def run(self, state: SearchState | None = None) -> SearchState:
        state = state or SearchState(failures=[0] * self.evaluator.num_examples)
        tokens_before = state.forward_tokens - self.evaluator.forward_tokens
        if state.optimizer is None:
            scale, objective, accuracy = self._scan_uniform(state)
            u = [math.log(scale)] * len(self.x)
            zeros = [0.0] * len(self.x)
            state.optimizer = {"name": NAME, "version": VERSION, "u": u, "m": zeros, "v": list(zeros),
                               "best": {"u": list(u), "objective": objective, "accuracy": accuracy, "generation": -1}}
            state.forward_tokens = tokens_before + self.evaluator.forward_tokens
            state.best_fitness, state.tokens_to_best = objective, state.forward_tokens
            state.generation = -1
        elif (state.optimizer.get("name"), state.optimizer.get("version")) != (NAME, VERSION):
            found = " ".join(str(state.optimizer[k]) for k in ("name", "version") if k in state.optimizer) or "ga"
            raise LpesError(f"the checkpoint is from {found}, not {NAME} {VERSION}: resume it with that, or delete "
                            "it to start over")
        while state.generation < self.settings.generations and state.stop_reason is None:
            self._generation(state, tokens_before)
        return state

    def _scan_uniform(self, state: SearchState) -> tuple[float, float, float]:
        """Generation -1: the objective of each grid scale in every layer (forward passes only); the best is
        where the descent starts (at a tie the gentler scale), so the curve found can only match or beat it."""
        grid = self.space.grid.values
        tokens_before = self.evaluator.forward_tokens
        everything = list(range(self.evaluator.num_examples))
        progress = self.step_progress("lpes-search gen 0 uniform scan", len(grid), len(grid) * len(everything)) \
            if self.step_progress else None
        scored = []
        try:
            for start in range(0, len(grid), max(1, self.settings.replicas)):
                scales = grid[start:start + max(1, self.settings.replicas)]
                jobs = [((s,) * self.space.num_layers, everything) for s in scales]
                for scale, (logprobs, verdicts) in zip(scales, self.evaluator.logprobs_many(jobs)):
                    scored.append((weighted(logprobs, self.weights), scale, sum(verdicts) / len(verdicts)))
                    if progress is not None:
                        progress.computed(len(everything))
                        progress.finished()
        finally:
            if progress is not None:
                progress.close()
        objective, scale, accuracy = max(scored, key=lambda js: (js[0], -abs(math.log(js[1]))))
        state.uniform = {"scale": scale, "fitness": objective, "tokens": self.evaluator.forward_tokens - tokens_before,
                         "scanned": [[s, j] for j, s, _ in scored]}
        return scale, objective, accuracy

    def scales(self, u: list[float]) -> tuple[float, ...]:
        return self.curve(u).spec(self.space.grid, self.space.num_layers).scales

    def curve(self, u: list[float]) -> Curve:
        return Curve(tuple((x, math.exp(v)) for x, v in zip(self.x, u)))

    def _generation(self, state: SearchState, tokens_before: int) -> None:
        generation = state.generation + 1
        everything = list(range(self.evaluator.num_examples))
        progress = self.step_progress(f"lpes-search gen {generation}/{self.settings.generations} gradient",
                                      len(self.batches) + 1, 2 * len(everything)) if self.step_progress else None
        opt = copy.deepcopy(state.optimizer)  # the checkpoint's state stays as it was until the pass is done
        try:
            d_scales = self._pass(opt, generation, progress)
            [(logprobs, verdicts)] = self.evaluator.logprobs_many([(self.scales(opt["u"]), everything)])
            if progress is not None:
                progress.computed(len(everything))
                progress.finished()
        finally:
            if progress is not None:
                progress.close()
        objective = weighted(logprobs, self.weights)
        scales = self.scales(opt["u"])
        accuracy = sum(verdicts) / len(verdicts)
        for i, ok in enumerate(verdicts):
            state.failures[i] += not ok
        before = opt["best"]
        if objective > before["objective"] + MIN_GAIN:
            opt["best"] = {"u": list(opt["u"]), "objective": objective, "accuracy": accuracy, "generation": generation}
        else:  # the pass went too far: back to the best point, with half the step and fresh moments
            opt["learning_rate"] = opt.get("learning_rate", self.gradient.learning_rate) / 2
            opt["u"], opt["m"], opt["v"], opt["step"] = list(before["u"]), [0.0] * len(self.x), [0.0] * len(self.x), 0
        state.optimizer = opt
        state.generation = generation
        state.evaluations += 1
        best = opt["best"]
        state.unchanged = 0 if best is not before else state.unchanged + 1
        state.parents = [Scored(self.curve(best["u"]), best["objective"], 0, sum(abs(v) for v in best["u"]))]
        state.forward_tokens = tokens_before + self.evaluator.forward_tokens
        if best is not before:
            state.best_fitness, state.tokens_to_best = best["objective"], state.forward_tokens
            state.improvements.append([best["objective"], state.tokens_to_best])
        if self.settings.patience and state.unchanged >= self.settings.patience:
            state.stop_reason = (f"the objective has not risen for {self.settings.patience} generations "
                                 f"(--patience {self.settings.patience})")
        state.history.append({
            "generation": generation, "best": best["objective"], "mean_scored": objective, "scored": 1,
            "raced_out": 0, "duplicates_skipped": 0, "forward_tokens": state.forward_tokens, "genomes": generation + 1,
            "unchanged": state.unchanged, "objective": objective, "accuracy_teacher_forced": accuracy,
            "scales": list(scales), "steps": len(self.batches),
            # dJ/ds_h summed over the pass's batches, each at the point of its own step (the first batch's at
            # where the pass began): which layers want more interpolation (> 0) and which less (< 0)
            "gradient": [float(g) for g in d_scales], "gradient_norm": float(np.linalg.norm(d_scales)),
            "objective_by_example": list(logprobs),
        })
        if self.on_generation is not None:
            self.on_generation(state)

    def _pass(self, opt: dict, generation: int, progress) -> np.ndarray:
        """One Adam step per fixed batch, from opt's point; the batches' gradients dJ/ds summed."""
        total = np.zeros(self.space.num_layers)
        for batch in self.batches:
            [result] = self.evaluator.gradients(self.scales(opt["u"]), [batch], self.weights)
            d_scales = np.array(result.gradient)
            if not (math.isfinite(result.objective) and np.all(np.isfinite(d_scales))):
                raise LpesError(f"generation {generation}: the objective or its gradient is not finite (NaN or "
                                "inf); the checkpoint of the generation before is kept: resume with a smaller "
                                "--learning-rate or narrower --scale-grid")
            total += d_scales
            self._adam(opt, np.exp(np.array(opt["u"])) * (self.basis.T @ d_scales))
            if progress is not None:
                progress.computed(len(batch))
        return total

    def _adam(self, opt: dict, d_u: np.ndarray) -> None:
        """One Adam step up the objective, projected onto the grid's bounds (bias-corrected moments)."""
        step = opt.get("step", 0) + 1
        m = BETAS[0] * np.array(opt["m"]) + (1 - BETAS[0]) * d_u
        v = BETAS[1] * np.array(opt["v"]) + (1 - BETAS[1]) * d_u**2
        m_hat, v_hat = m / (1 - BETAS[0] ** step), v / (1 - BETAS[1] ** step)
        rate = opt.get("learning_rate", self.gradient.learning_rate)
        u = np.array(opt["u"]) + rate * m_hat / (np.sqrt(v_hat) + EPSILON)
        opt["u"] = [float(x) for x in np.clip(u, *self.bounds)]
        opt["m"], opt["v"], opt["step"] = [float(x) for x in m], [float(x) for x in v], step


def _basis(x: list[float], num_layers: int) -> np.ndarray:
    """W with s_h = sum_k W[h, k] s_k for control scales s_k at positions `x`: the spec's own Bezier read-off
    (lpes.foundation.bezier.layer_scales), which is linear in the control scales, applied to each unit vector."""
    columns = []
    for k in range(len(x)):
        points = np.array([[xk, 1.0 if j == k else 0.0] for j, xk in enumerate(x)])
        columns.append(layer_scales(points, num_layers))
    return np.array(columns).T


def _fixed_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Calibration examples in batches of similar length (longest first), fixed for the whole search."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


def check_gradient_search(space: SearchSpace, rope: RopeScheme, objective: str) -> None:
    """Refuse, at plan time, a gradient search that cannot run or whose problem is degenerate."""
    if objective not in LIKELIHOODS:
        raise LpesError("--optimizer gradient climbs the gold answer's likelihood: use --objective logprob or "
                        "answer-logprob (right/wrong verdicts have no gradient)")
    if rope.length_dependent:
        raise LpesError("--optimizer gradient: per-layer dynamic NTK moves its base with the sequence length, "
                        "a step function of nothing the search changes; use --rope-type linear or yarn, or "
                        "--optimizer cmaes")
    if space.degree + 1 > space.num_layers:
        raise LpesError(f"--degree {space.degree} with --optimizer gradient: {space.degree + 1} control points for "
                        f"{space.num_layers} layers leave the curve underdetermined; use --degree "
                        f"{max(1, space.num_layers - 1)} or less")
    if len(set(space.grid.values)) < 2:
        raise LpesError("--optimizer gradient needs a --scale-grid with MIN < MAX (its bounds)")


# What one backward pass keeps alive, per token of a batch and per decoder layer, in units of the model's
# dtype: the saved inputs of the norms, projections, RoPE and MLP (about ACTIVATIONS_PER_HIDDEN x hidden
# + ACTIVATIONS_PER_INTERMEDIATE x intermediate values) and the attention weights (heads x tokens, the
# quadratic part). Fitted on SmolLM2-135M and Gemma 3 270M at 400-2,000 tokens (bench/RESULTS.md, "What a
# backward pass costs"); the estimate is checked against what is available, with a margin, at plan time.
ACTIVATIONS_PER_HIDDEN = 12
ACTIVATIONS_PER_INTERMEDIATE = 4
MEMORY_MARGIN = 1.25


def backward_bytes(config, batch_tokens: int, longest: int, dtype_bytes: int) -> int:
    """Memory a forward and backward pass over `batch_tokens` padded positions (rows of `longest`) holds."""
    text = getattr(config, "text_config", None) or config
    hidden, layers = text.hidden_size, text.num_hidden_layers
    intermediate = getattr(text, "intermediate_size", 4 * hidden)
    heads = text.num_attention_heads
    per_token = ACTIVATIONS_PER_HIDDEN * hidden + ACTIVATIONS_PER_INTERMEDIATE * intermediate + heads * longest
    return int(batch_tokens * layers * per_token * dtype_bytes)


def check_backward_fits(config, lengths: list[int], batch_size: int, dtype_bytes: int,
                        available: int | None) -> int:
    """The estimate for the largest fixed batch; LpesError (one line) where it would not fit in `available`."""
    from lpes.foundation.devices import format_bytes

    batches = _fixed_batches(lengths, batch_size)
    need = max(backward_bytes(config, len(b) * max(lengths[i] for i in b), max(lengths[i] for i in b), dtype_bytes)
               for b in batches)
    if available is not None and need * MEMORY_MARGIN > available:
        longest = max(lengths)
        one = backward_bytes(config, longest, longest, dtype_bytes)
        hint = (f"lower --batch-size (one {longest:,}-token prompt needs about {format_bytes(one)})"
                if one * MEMORY_MARGIN <= available else "use shorter --data prompts or a machine with more memory")
        raise LpesError(f"--optimizer gradient: a backward pass over the largest batch needs about "
                        f"{format_bytes(need)} of memory, {format_bytes(available)} available; {hint}")
    return need
