"""lpes-search as a function: model + calibration data -> best.json (spec), plots, provenance.

`search()` checks its options (options.py), plans (plan.py: everything checked and read before a
replica loads), then runs: opens the replicas, runs the optimizer's loop, scores the stock
baselines and the held-out examples, and writes the spec and its plots.

A checkpoint (`<out>.state.json`) is written atomically after every generation; the
same command run again resumes from it and ends with exactly the result an
uninterrupted run gives. It is removed once best.json is written.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lpes.foundation.decision import Candidate, candidate_name
from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_text_atomic
from lpes.foundation.provenance import Provenance
from lpes.foundation.spec import RopeScheme, SearchTask, Spec, StockRope, dump_spec
from lpes.search.baselines import (
    BaselineResult,
    describe,
    parse_baselines,
    scan_stock_baselines,
    scan_stock_objective,
)
from lpes.search.fitness import ModelEvaluator, UsageMeter
from lpes.search.ga import GASettings, SearchState
from lpes.search.genome import ScaleGrid
from lpes.search.objective import LIKELIHOODS, OWN_ANSWERS
from lpes.search.optimizers import optimizer
from lpes.search.options import SearchOptions, check_options, with_defaults
from lpes.search.plan import SearchPlan, gold_count, plan_search
from lpes.search.progress import StepProgress, clock
from lpes.search.replica import WIDE_BATCHES
from lpes.search.replicas import ReplicaPool, open_pool

# Where scoring ran changes neither the result nor what may resume it; the spec records the
# layout apart (provenance["replicas"]), without the machine's addresses or device names.
_NO_LAYOUT = {"device": None, "ray": None, "replicas": None, "gpus_per_replica": None}
# The ladder of lengths' default time: a quarter of the search's own (issue 50: at most +25%), at least 2 minutes.
LADDER_SHARE, LADDER_MIN_SECONDS = 0.25, 120.0


def search_loop(plan: SearchPlan, options: SearchOptions, evaluator: ModelEvaluator, settings: GASettings,
                after_generation, step_progress):
    """The search loop of `--optimizer` (search/optimizers.py's registry: the GA or CMA-ES racing verdicts with the
    same racing, checkpoints and patience, CMA-ES on the likelihood, or gradient ascent on it) and `--objective`."""
    return optimizer(options.optimizer).build(plan, options, evaluator, settings, after_generation, step_progress)


def search(model: str, out: str | Path, options: SearchOptions = SearchOptions(), force: bool = False,
           progress: bool = True) -> Spec:
    """Find the curve for `model`; write the spec to `out` and the plots next to it.

    As lpes-convert: one run per `out` at a time (its lock, foundation/outputs.py, which also owns the
    checkpoint beside it), and every file it writes is checked before any work: names, a test write,
    free space.
    """
    from lpes.foundation.outputs import check_files_beside, check_output_file, locked_output

    options = with_defaults(options)
    check_options(options)
    path = check_output_file(out, force)
    room = check_files_beside(path, [path.name, path.name + ".state.json", path.stem + "_curve.png",
                                     path.stem + "_fitness.png", path.stem + "_lengths.png"], SEARCH_OUTPUT_BYTES)
    with locked_output(path):
        return _search(model, path, options, force, progress, room)


# What lpes-search writes at most: the spec, two plots and the checkpoint (its history grows per generation).
SEARCH_OUTPUT_BYTES = 16 * 2**20


@dataclass
class _Found:
    """What the run found: the final state, the curve, the stock baselines, the held-out scores, the layout."""

    state: SearchState
    spec: Spec
    baselines: list[BaselineResult]
    skipped: dict[str, str]
    held_out: dict
    layout: Any
    answer_targets: dict[str, int] | None  # --objective answer-*: how many targets were made each way


def _search(model: str, out: Path, options: SearchOptions, force: bool, progress: bool, room: str) -> Spec:
    plan = plan_search(model, out, options, force)
    started = time.time()
    # The resolved dtype, not "auto", decides what may resume: float32 and bfloat16 runs score differently.
    state = _resume(plan.checkpoint, replace(options, dtype=plan.dtype), plan.model_path, force)
    for note in plan.notes:  # said only now that every check has held: a refusal above is the only line
        print(f"lpes-search: {note}", file=sys.stderr)
    print(f"lpes-search: plan: {room}", file=sys.stderr)  # every check held: what it writes, and the room for it
    found = _run(plan, options, state, progress)
    spec = replace(found.spec, provenance=Provenance.parse(_provenance(plan, options, found)))
    _write_outputs(spec, found, plan.out)
    plan.checkpoint.unlink(missing_ok=True)
    _say_done(plan.out, options, found, time.time() - started)
    return spec


def _run(plan: SearchPlan, options: SearchOptions, state: SearchState | None, progress: bool) -> _Found:
    """Open the replicas; search (the uniform scan first), score the stock baselines and the held-out examples."""
    started = time.perf_counter()
    key = _settings_key(replace(options, dtype=plan.dtype), plan.model_path)
    layers = plan.config.num_hidden_layers
    pool = open_pool(plan.model_path, plan.tokenizer, plan.examples, method=options.method,
                     batch_size=options.batch_size, dtype=plan.dtype, device=options.device, ray=options.ray,
                     replicas=options.replicas, gpus_per_replica=options.gpus_per_replica)
    targets = _use_own_answers(pool, plan, options.objective, progress) if options.objective in OWN_ANSWERS else None
    # Racing chunks start at one example (most hopeless genomes fail at once) and double up to one full
    # batch, or take at once what a genome must fail before it could be dropped, up to the replica's wide batch;
    # with several replicas as many genomes race at once, one chunk each, so chunks do not grow with them.
    settings = replace(plan.settings, chunk=options.batch_size, wide_chunk=WIDE_BATCHES * options.batch_size,
                       first_chunk=1, replicas=pool.size)
    evaluator = ModelEvaluator(pool, len(plan.examples), plan.rope)
    reporter = _Reporter(progress, UsageMeter(evaluator.usage), lambda: evaluator.forward_tokens, options.patience,
                         options.generations)

    def after_generation(state: SearchState) -> None:
        write_text_atomic(plan.checkpoint, json.dumps({"settings_key": key, "state": state.to_json()}))
        reporter(state)

    # It scans the uniform scales first and seeds generation 0 with the best: with elitism the
    # curve found can only match or beat it on calibration.
    try:
        state = search_loop(plan, options, evaluator, settings, after_generation, reporter.step).run(state)
        # No verdict right anywhere: the all-ones curve would be written as a finding.
        if options.objective not in LIKELIHOODS and state.parents[0].fitness <= 0:
            plan.checkpoint.unlink(missing_ok=True)
            raise LpesError(_nothing_scored(pool, plan.tokenizer, plan.examples, layers, options, plan.task))
        spec = replace(state.parents[0].genome.spec(plan.grid, layers), rope=plan.rope)
        baselines, skipped = _stock_baselines(plan.config, options, evaluator, plan.grid,
                                              (settings.chunk * pool.size, settings.wide_chunk * pool.size), progress,
                                              max(n for _, n in plan.lengths), plan.weights)
        if not plan.rope.linear:  # the uniform scan was this stock type's own scan, raced the same way
            baselines.insert(0, _uniform_as_stock(plan.rope, state, plan.grid))
        held_out = _held_out(pool, plan, spec, state, baselines, options, progress, time.perf_counter() - started)
        _warn_stretched_windows(plan, held_out)
        if plan.task.answer_tokens is None:  # the one-pass check credits an answer only if it starts with the value
            said = _answers_sample(pool, plan.tokenizer, plan.examples[:8], layers, 8)
            if said:
                print(f"lpes-search: warning: {said} (the unscaled model, on calibration prompts)", file=sys.stderr)
    finally:
        pool.close()
    return _Found(state, spec, baselines, skipped, held_out, pool.layout, targets)


def _provenance(plan: SearchPlan, options: SearchOptions, found: _Found) -> dict:
    """What best.json records of the search: the model, every setting, the data, the run, the baselines."""
    from lpes.converter.fingerprint import model_fingerprint
    from lpes.converter.loading import model_label
    from lpes.validation.report import shareable_data
    from lpes.validation.tasks import portable_description, split_provenance

    state, rope, holdout, prompts = found.state, plan.rope, plan.holdout, [p for p, _ in plan.lengths]
    return {
        "model": model_fingerprint(plan.config, plan.model_path, str(plan.model)),  # name, config, weights digests
        "base_model": model_label(str(plan.model)),  # a local folder by its name: best.json is shared
        "search": {**asdict(options), **_NO_LAYOUT, "data": portable_description(options.data), "dtype": plan.dtype,
                   "population": plan.settings.population, "generations_run": state.generation,
                   "stop_reason": state.stop_reason, "optimizer_version": (state.optimizer or {}).get("version"),
                   "calibration_examples": len(plan.examples),
                   "calibration_data": split_provenance(plan.task, "search"),
                   "held_out_data": split_provenance(plan.task, "validation",
                                                     -(-len(holdout) // gold_count(holdout))),
                   "fitness": state.parents[0].fitness, "evaluations": state.evaluations,
                   "raced_out": state.raced_out, "duplicates_skipped": state.duplicates_skipped,
                   "forward_tokens": state.forward_tokens, "tokens_to_best_fitness": state.tokens_to_best,
                   "history": state.history,
                   # One linear scale for every layer; under yarn/dynamic the scan's best is a stock baseline.
                   "best_uniform_scale": state.uniform["scale"] if rope.linear and state.uniform else None,
                   "best_uniform_fitness": state.uniform["fitness"] if rope.linear and state.uniform else None,
                   "uniform_scan_tokens": state.uniform["tokens"] if state.uniform else 0,
                   "stock_baselines": found.baselines, "stock_baselines_skipped": found.skipped,
                   **({"answer_targets": found.answer_targets} if found.answer_targets else {}),
                   # What lpes-convert and lpes-validate validate on unless told otherwise (Spec.search_task).
                   "task": SearchTask(shareable_data(options.data), options.chat_template, plan.task.answer_tokens,
                                      (min(prompts), max(prompts))).to_json()},
        "held_out": {k: v for k, v in found.held_out.items() if k != "decision"},
        # What lpes-convert ships (foundation/decision.py); None without held-out examples (--holdout 0).
        "decision": None if found.held_out["decision"] is None else found.held_out["decision"].to_json(),
        "replicas": found.layout,
    }


def _say_done(out: Path, options: SearchOptions, found: _Found, seconds: float) -> None:
    """The closing lines: what was written, fitness and held-out accuracy, and any baseline above the curve."""
    fitness, held_out = found.state.parents[0].fitness, found.held_out
    held = (f"held-out {_score(held_out['unscaled'])} -> {_score(held_out['lpes'])}" if held_out["examples"]
            else f"no held-out examples: --holdout {options.holdout}")
    what = "objective: mean gold log-likelihood" if options.objective in LIKELIHOODS else "fitness"
    print(f"lpes-search: wrote {out} in {seconds:.0f}s ({what} {fitness:.3f}, {held})", file=sys.stderr)
    if held_out.get("decision"):
        print(f"lpes-search: decision: {held_out['decision'].reason}; lpes-convert ships it (--ship curve: the "
              "per-layer curve instead)", file=sys.stderr)
    better = [b for b in found.baselines if b["fitness"] > fitness]  # scored by the same objective
    if better and not held_out.get("decision"):  # with a decision its table already held them out
        names = ", ".join(f"{StockRope(b['rope_type'], b['factor']).name} ({b['fitness']:.3f})" for b in better)
        print(f"lpes-search: on calibration {names} scored above the curve: lpes-validate shows them on "
              "held-out examples", file=sys.stderr)


def _stock_baselines(config, options: SearchOptions, evaluator: ModelEvaluator, grid: ScaleGrid,
                     chunks: tuple[int, int], progress: bool, longest: int,
                     weights: list[float]) -> tuple[list[BaselineResult], dict[str, str]]:
    """The stock RoPE types this model can take, each at its best factor; and why the others were left out.

    A factor at which the type is the unscaled model on these examples (`longest` positions at most:
    YaRN at 1, dynamic NTK within the trained length) is not scored again: the uniform scan had it.
    """
    from lpes.converter.reference import stock_rope_unsupported

    # --rope-type yarn/dynamic: that type's baseline is the uniform scan's best (search._uniform_as_stock).
    wanted = tuple(t for t in parse_baselines(options.baselines) if t != options.rope_type)
    skipped = {t: why for t in wanted if (why := stock_rope_unsupported(config, t))}
    trained = getattr(config, "max_position_embeddings", None)
    grid_factors = [f for f in grid.values if f >= 1.0]
    factors = {t: [f for f in grid_factors if not StockRope(t, f).same_as_unscaled(longest, trained)]
               for t in wanted if t not in skipped}
    for rope_type in [t for t, left in factors.items() if grid_factors and not left]:
        skipped[rope_type] = (f"it is the unscaled model on these examples (each within the {trained} positions "
                              "the model was trained for, where dynamic NTK changes nothing)" if rope_type == "dynamic"
                              else "the grid's only factor >= 1 is 1, where it is the unscaled model")
        del factors[rope_type]
    for rope_type, why in skipped.items():
        print(f"lpes-search: no {rope_type} baseline: {why}", file=sys.stderr)
    if options.objective in LIKELIHOODS:  # scored as the curve was: comparable with its objective
        results = [result for rope_type, left in factors.items()
                   for result in scan_stock_objective(evaluator, [rope_type], left, weights, progress)]
    else:
        results = [result for rope_type, left in factors.items()
                   for result in scan_stock_baselines(evaluator, [rope_type], left, chunks[0], progress,
                                                      halving=not options.exact_scan, wide_chunk=chunks[1])]
    if results:
        print(f"lpes-search: {describe(results)}", file=sys.stderr)
    return results, skipped


def _nothing_scored(pool: ReplicaPool, tokenizer, examples: list, layers: int, options: SearchOptions, task) -> str:
    """The one line a search ends with when no candidate answered a single calibration example."""
    budget = (f"{task.answer_tokens} tokens" if task.answer_tokens is not None
              else "the value's own tokens, so the first token must be the value")
    text = (f"no candidate answered any of the {len(examples)} calibration examples (every uniform scale, the "
            "unscaled model included, scored 0), so there is no curve to write; the task does not fit this model "
            f"as set up (chat template {'on' if options.chat_template else 'off'}, answer budget {budget})")
    said = _answers_sample(pool, tokenizer, examples[:4], layers, max(task.answer_tokens or 0, 24), always=True)
    text += f"; {said}" if said else ""
    hints = ["--no-chat-template" if options.chat_template else "the chat template (drop --no-chat-template)",
             "--answer-tokens 100" if task.answer_tokens is None else "a larger --answer-tokens", "other --data"]
    return f"{text}. Try {', '.join(hints)}"


def _use_own_answers(pool: ReplicaPool, plan: SearchPlan, objective: str, progress: bool) -> dict[str, int]:
    """--objective answer-*: the unscaled model answers every calibration prompt once (greedy), and each
    replica's targets become those answers with the gold value in place (validation/own_answers.py)."""
    from lpes.validation.own_answers import MEANING, own_answer_examples

    layers = plan.config.num_hidden_layers
    if progress:
        print(f"lpes-search: {objective}: the unscaled model answers the {len(plan.examples)} calibration "
              "prompts (greedy), the targets", file=sys.stderr, flush=True)
    generated = pool.greedy_texts((1.0,) * layers, plan.examples)
    targets, counts = own_answer_examples(plan.examples, generated)
    if objective == "answer-accuracy":  # no answer budget: the verdict is teacher-forced (scoring.calibration_correct)
        targets = [replace(target, answer_tokens=None) for target in targets]
    pool.set_examples(targets)
    print(f"lpes-search: {objective} targets: " + ", ".join(f"{n} {how} ({MEANING[how]})"
                                                              for how, n in counts.items()),
          file=sys.stderr, flush=True)
    return counts


def _answers_sample(pool: ReplicaPool, tokenizer, examples: list, layers: int, tokens: int,
                    always: bool = False) -> str | None:
    """What the unscaled model writes on `examples` (greedy, `tokens` at most), when most answers do not start
    with the value (`always`: in any case); None on Ray replicas (their models are not in this process).

    It leaves the first local replica's model unscaled behind its back: call it after the last scoring.
    """
    from lpes.converter.reference import apply
    from lpes.validation.report import answers_not_value
    from lpes.validation.scoring import greedy_correct

    replicas = getattr(pool, "replicas", None)
    if not replicas or not examples:
        return None
    apply(replicas[0].model, Spec.from_scales([1.0] * layers))
    scores = greedy_correct(replicas[0].model, tokenizer, examples, max_new_tokens=tokens)
    return answers_not_value(scores.results, examples, always=always)


def _settings_key(options: SearchOptions, model_path: Path) -> str:
    relevant = {**asdict(options), **_NO_LAYOUT, "model": str(model_path)}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _resume(checkpoint: Path, options: SearchOptions, model_path: Path, force: bool):
    """The state saved by an interrupted run of the same search, else None."""
    if not checkpoint.is_file():
        return None
    try:
        data = json.loads(checkpoint.read_text())
        generation = data["state"]["generation"]
        state = SearchState.from_json(data["state"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        if force:
            print(f"lpes-search: ignoring {checkpoint} (unreadable; --force)", file=sys.stderr)
            return None
        raise LpesError(f"{checkpoint} is not a readable search checkpoint ({type(err).__name__}); delete it to "
                        "start over, or pass --force") from None
    if data.get("settings_key") != _settings_key(options, model_path):
        if not force:
            raise LpesError(f"{checkpoint} is from a search with other settings; delete it or pass --force")
        print(f"lpes-search: ignoring {checkpoint} (other settings; --force)", file=sys.stderr)
        return None
    print(f"lpes-search: resuming from {checkpoint} (generation {generation})", file=sys.stderr)
    return state


def _uniform_as_stock(rope: RopeScheme, state: SearchState, grid: ScaleGrid) -> BaselineResult:
    """Under --rope-type yarn/dynamic a uniform curve is that stock type at its factor (lpes_rope, tested):
    the uniform scan's best is the stock baseline, same racing, same tie rule (the smaller factor)."""
    return BaselineResult(rope_type=rope.rope_type, factor=state.uniform["scale"], fitness=state.uniform["fitness"],
                          factors_scanned=list(grid.values), tokens=state.uniform["tokens"])


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _held_out(pool: ReplicaPool, plan: SearchPlan, best: Spec, state: SearchState, baselines: list[BaselineResult],
              options: SearchOptions, progress: bool, seconds_so_far: float) -> dict:
    """Greedy verdicts (the benchmark's test) of every candidate on the held-out examples, each candidate on the
    ladder of lengths (search/lengths.py), and the decision.

    The candidates, simplest first: unscaled, the best uniform scale, each stock baseline, the per-layer
    curve; one that computes what an earlier one does (a curve equal to the uniform scale) is not scored
    again. foundation/decision.py decides which to ship.
    """
    from lpes.foundation.decision import decide, format_table, in_middle

    examples, alpha = plan.holdout, options.alpha

    if not examples:
        return {"examples": 0, "unscaled": None, "lpes": None, "decision": None}  # null, not NaN: the spec is JSON
    candidates = _candidates(best, state, baselines, plan.config)
    verdicts: dict[str, tuple[bool, ...]] = {}
    scored = []
    for number, (candidate, entry) in enumerate(candidates, 1):
        key = repr(candidate)
        if key not in verdicts:
            if progress:
                print(f"lpes-search: held out {number}/{len(candidates)}: {entry['name']} on {len(examples)} "
                      "prompts", file=sys.stderr, flush=True)
            verdicts[key] = tuple(pool.greedy_verdicts(candidate, examples))
        scored.append(Candidate(**entry, verdicts=verdicts[key]))
    middle = [in_middle(e.gold_index, e.num_pairs) for e in examples]
    lengths = None
    if plan.ladder is not None:
        from lpes.search.lengths import run_ladder

        ladder, named = plan.ladder, list({entry["name"]: (entry["name"], c) for c, entry in candidates}.values())
        budget = (options.length_minutes * 60 if options.length_minutes is not None
                  else max(LADDER_MIN_SECONDS, LADDER_SHARE * seconds_so_far))
        lengths = run_ladder(pool, named, ladder.ids, ladder.search, ladder.serve, ladder.trained, budget,
                             ladder.probe, progress, ladder.unreadable)
    decision = decide(_distinct(scored), middle, alpha, lengths)
    for line in format_table(decision, escape=False):
        print(f"lpes-search: {line}" if line else "", file=sys.stderr)
    curve = verdicts.get(repr(_as_candidate(best)))
    if curve is None:  # a curve of one scale off the grid's scan (a resumed older search): scored as itself
        curve = tuple(pool.greedy_verdicts(_as_candidate(best), examples))
    return {"examples": len(examples), "unscaled": sum(scored[0].verdicts) / len(examples),
            "lpes": sum(curve) / len(examples), "decision": decision}


def _as_candidate(spec: Spec):
    """What a replica scores for `spec`: a curve of one stock factor is that stock RoPE (lpes_rope, tested)."""
    from lpes.search.candidates import SchemeScales

    if spec.rope.linear:
        return tuple(spec.scales)
    if len(set(spec.scales)) == 1:
        return spec.rope.stock(spec.scales[0])
    return SchemeScales(tuple(spec.scales), spec.rope)


def _warn_stretched_windows(plan: SearchPlan, held_out: dict) -> None:
    """One line per candidate whose scales below 1 stretch a sliding-window layer past its window at the longest
    calibration or held-out length (converter/architectures.py)."""
    from lpes.converter.architectures import window_warning

    layers = plan.config.num_hidden_layers
    longest = max(n for _, n in plan.lengths)
    for row in held_out["decision"].rows if held_out.get("decision") else ():
        scales = row.scales or ([row.factor] * layers if row.kind == "uniform" else None)
        if scales and (line := window_warning(plan.config, scales, longest, row.name)):
            print(f"lpes-search: {line}", file=sys.stderr)


def _candidates(best: Spec, state: SearchState, baselines: list[BaselineResult],
                config) -> list[tuple[Any, dict]]:
    """(what a replica scores, the decision's fields) of every candidate, simplest first. On a model with
    sliding-window and full-attention layers (Gemma 3), the best uniform scale on the full-attention layers alone
    is a candidate too: a stock config there, and a sliding window it does not stretch (issue 50)."""
    layers = len(best.scales)
    out: list[tuple[Any, dict]] = [((1.0,) * layers, {"name": candidate_name("unscaled"), "kind": "unscaled"})]
    uniform = state.uniform["scale"] if best.rope.linear and state.uniform else None
    if uniform is not None and uniform != 1.0:
        out.append(((float(uniform),) * layers, {"name": candidate_name("uniform", "linear", float(uniform)),
                                                 "kind": "uniform", "rope_type": "linear", "factor": float(uniform)}))
    types = list(getattr(config, "layer_types", None) or [])
    if uniform is not None and uniform != 1.0 and {"full_attention", "sliding_attention"} <= set(types):
        scales = tuple(float(uniform) if t == "full_attention" else 1.0 for t in types)
        out.append((scales, {"name": candidate_name("per-type", "linear", float(uniform)), "kind": "per-type",
                             "rope_type": "linear", "factor": float(uniform), "scales": scales}))
    for b in baselines:
        stock = StockRope(b["rope_type"], float(b["factor"]))
        out.append((stock, {"name": candidate_name("stock", stock.rope_type, stock.factor), "kind": "stock",
                            "rope_type": stock.rope_type, "factor": stock.factor}))
    if len(set(best.scales)) > 1:  # a curve of one scale is the uniform (or stock) candidate above
        out.append((_as_candidate(best), {"kind": "per-layer", "name": candidate_name("per-layer",
                                                                                      scheme=best.rope.rope_type),
                                          "scales": tuple(best.scales)}))
    return out


def _distinct(candidates: list) -> list:
    """Candidates by name, the first of each (a stock baseline at the factor of another is the same row)."""
    first: dict[str, Any] = {}
    for candidate in candidates:
        first.setdefault(candidate.name, candidate)
    return list(first.values())


def _write_outputs(spec: Spec, found: _Found, out: Path) -> None:
    from lpes.foundation.plots import plot_curve, plot_fitness, plot_lengths

    state = found.state
    dump_spec(spec, out)
    plot_curve(spec, out.with_name(out.stem + "_curve.png"), title="LPES curve found by lpes-search")
    uniform = state.uniform if spec.rope.linear else None  # else drawn as its stock baseline
    plot_fitness(state.history, out.with_name(out.stem + "_fitness.png"), uniform=uniform,
                 examples=len(state.failures), model=spec.base_model,  # failures: one count per example
                 stock=found.baselines, objective=spec.provenance.search.objective)
    if spec.decision is not None and spec.decision.lengths is not None:
        plot_lengths(spec.decision.lengths, spec.decision.alpha, out.with_name(out.stem + "_lengths.png"),
                     spec.decision.ship.name)


class _Reporter:
    """A progress line inside every step (search/progress.py) and a log line per generation."""

    def __init__(self, enabled: bool, usage: UsageMeter, tokens, patience: int = 0, generations: int = 0):
        self.enabled, self.usage, self.tokens = enabled, usage, tokens
        self.patience, self.generations = patience, generations
        self.ended: list[float] = [time.monotonic()]  # when each generation logged (the first: the start)

    def rest(self, generation: int) -> str:
        """What the generations left cost at most, at the mean time of those after generation 0 (which also
        holds the uniform scan): patience may stop the search sooner."""
        left = self.generations - generation
        if left <= 0 or len(self.ended) < 3:
            return ""
        per = (self.ended[-1] - self.ended[1]) / (len(self.ended) - 2)
        return f"; {left} generation{'s' if left > 1 else ''} left, ETA <= {clock(left * per)}"

    def step(self, label: str, candidates: int, verdicts: int) -> StepProgress:
        return StepProgress(label, candidates, verdicts, self.tokens, self.enabled)

    def __call__(self, state: SearchState) -> None:
        from tqdm.auto import tqdm

        last = state.history[-1]
        busy, rate = self.usage.step()
        self.ended.append(time.monotonic())
        if self.enabled:
            mean = "n/a" if last["mean_scored"] is None else f"{last['mean_scored']:.3f}"
            tqdm.write(f"generation {last['generation']}: best {last['best']:.3f}, mean {mean} over "
                       f"{last['scored']} scored, {last['raced_out']} raced out, "
                       f"{last['duplicates_skipped']} duplicates skipped, {last['forward_tokens']} tokens"
                       + (f", best unchanged {state.unchanged}/{self.patience} generations" if self.patience else "")
                       + f"; replicas busy {' '.join(f'{b:.0%}' for b in busy)}, "
                       f"tokens/s {' '.join(f'{r:.0f}' for r in rate)}"
                       + ("" if state.stop_reason else self.rest(last["generation"])), file=sys.stderr)
            if state.stop_reason:
                tqdm.write(f"lpes-search: stopping after generation {state.generation}: {state.stop_reason}",
                           file=sys.stderr)
