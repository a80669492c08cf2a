"""Planning a search: the options, the model, the RoPE scheme and the data checked, and the examples and the
tokenizer read, before a replica loads a weight (`plan_search` -> `SearchPlan`, which search/run.py runs)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path
from typing import Any

from lpes.foundation.decision import check_positions
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme, StockRope
from lpes.search.ga import GASettings
from lpes.search.genome import ScaleGrid, SearchSpace
from lpes.search.objective import gold_weights
from lpes.search.options import SearchOptions, check_options, resolve_dtype
from lpes.validation.length_probe import BLOCK


@dataclass
class SearchPlan:
    """Everything a search needs, checked before a replica loads: the model, the scheme, the data, the settings."""

    model: str  # as the user named it
    out: Path
    model_path: Path
    config: Any
    rope: RopeScheme
    task: Any  # tasks.TaskConfig, with --answer-tokens applied
    examples: list  # calibration
    holdout: list  # held-out examples scored before and after
    lengths: list[tuple[int, int]]  # per calibration example: prompt tokens, and with the answer's budget
    tokenizer: Any
    grid: ScaleGrid
    space: SearchSpace
    settings: GASettings
    dtype: str  # resolved: "auto" never reaches a replica
    checkpoint: Path
    weights: list[float]  # per calibration example, its weight in the logprob objective (search/objective.py)
    notes: list[str] = field(default_factory=list)  # lines said once every check has held (search/run.py)
    ladder: LadderPlan | None = None  # the lengths the decision is checked at beyond the search length


@dataclass(frozen=True)
class LadderPlan:
    """The ladder of lengths (search/lengths.py), resolved at plan time: its ends and the probe's tokens."""

    search: int  # the longest calibration prompt with its answer's budget, in tokens
    serve: int  # --serve-length, resolved
    trained: int  # the model's max_position_embeddings
    ids: list[int] | None  # the probe text's first `serve` tokens; None: no text reached that far
    probe: str  # what the probe reads, in words
    unreadable: str | None = None  # why no text could be used (`ids` None)


def plan_search(model: str, out: Path, options: SearchOptions, force: bool) -> SearchPlan:
    """Check the options, the model, the scheme and the data; read the examples and the tokenizer."""
    from lpes.validation.model_preflight import Output, Request, preflight
    from lpes.validation.tasks import data_files, examples_for, task_config
    from lpes.validation.vocabulary import check_vocabulary

    grid, settings = check_options(options)
    inputs = tuple(("--data", path) for path in data_files(options.data))  # --force would write the spec over it
    resolved = preflight(Request("lpes-search", str(model), Output(out, "file", force, inputs),
                                 rope_type=options.rope_type, dtype=lambda: resolve_dtype(options)))
    out, model_path, config, rope = resolved.out, resolved.model_path, resolved.config, resolved.rope
    task = task_config(model_path, options.data)
    if options.answer_tokens is not None:
        task = replace(task, answer_tokens=options.answer_tokens)
    held_out_task = _held_out_task(task, options.holdout)
    _check_sizes(config, task, held_out_task, options.holdout, resolved.label)  # before any is built
    examples = examples_for(task, model_path, use_chat_template=options.chat_template, split="search")
    if not examples:
        raise LpesError("the calibration data has no examples")
    tokenizer = _tokenizer(model_path)
    _check_longest(config, tokenizer, examples, resolved.label)  # before the held-out prompts are built
    held_out_data = examples_for(held_out_task, model_path, use_chat_template=options.chat_template,
                                 split="validation")
    space = SearchSpace(grid, config.num_hidden_layers, options.degree)
    every = examples + held_out_data  # prompts and answers apart: an answer that encodes to nothing is named
    check_vocabulary(tokenizer, [e.prompt for e in every] + [e.answer for e in every], "--data",
                     resolved.label)
    notes: list[str] = [resolved.licence] if resolved.licence else []
    holdout = _held_out_examples(held_out_data, options.holdout, notes)
    check_positions([(e.gold_index, e.num_pairs) for e in holdout], "--data (held out)")
    lengths = _lengths(tokenizer, examples)
    ladder = _ladder(config, tokenizer, max(n for _, n in lengths), options, [e.prompt for e in every])
    if ladder is None:  # said, so that nobody takes a decision made at one length for one checked at more
        notes.append(f"lengths: no longer prompt to check: the model serves {max(n for _, n in lengths):,} tokens, "
                     "the search length (--serve-length checks longer ones)")
    _check_scheme_reaches(config, rope, grid, max(n for _, n in lengths))
    if options.optimizer == "gradient":
        from lpes.search.gradient import check_gradient_search

        check_gradient_search(space, rope, options.objective)
        _check_backward_memory(config, [budget for _, budget in lengths], options)
    _check_forward_memory(config, max(n for _, n in lengths), options, greedy=task.answer_tokens is not None)
    if resolved.dtype_note:  # weights stored unlike config.json says
        notes.append(resolved.dtype_note)
    return SearchPlan(model, out, model_path, config, rope, task, examples, holdout, lengths,
                 tokenizer, grid, space, settings, resolved.dtype, out.with_name(out.name + ".state.json"),
                 gold_weights([e.gold_index for e in examples]), notes, ladder)


def _ladder(config, tokenizer, search: int, options: SearchOptions, prompts: list[str]) -> LadderPlan | None:
    """--serve-length resolved and checked; the probe's tokens up to it (None: no rung beyond the search).

    Without --length-text the probe reads the built-in text, or where the tokenizer cannot (the bundled models'
    own vocabularies) the task's `prompts`; where neither reaches the serving length the ladder has no tokens
    (`ids` None) and the decision is checked at the search length only, which then limits what ships."""
    from lpes.search.lengths import check_serve_length, rungs
    from lpes.validation.length_probe import TEXT_NAME, builtin_text, probe_ids, read_text
    from lpes.validation.sizes import trained_positions

    trained = trained_positions(config) or search
    default = max(trained, search)
    serve = check_serve_length(default if options.serve_length is None else options.serve_length, search, trained,
                               options.beyond_trained)
    if not rungs(search, serve):  # nothing longer to check; a serving length below the model's is still its limit
        return None if serve >= trained else LadderPlan(search, serve, trained, None, "none: served at the search "
                                                        "length")
    _check_ladder_memory(config, serve, options)
    if options.length_text is not None:  # the user's own: it must serve
        ids = probe_ids(tokenizer, serve, _prefix(read_text(options.length_text), serve), "--length-text")
        return LadderPlan(search, serve, trained, ids, _probe_words("--length-text", options.alpha))
    why = []
    for text, where in ((builtin_text(), TEXT_NAME), (" ".join(prompts), "the task's prompts")):
        try:
            return LadderPlan(search, serve, trained, probe_ids(tokenizer, serve, _prefix(text, serve), where),
                              _probe_words(where, options.alpha))
        except LpesError as err:
            why.append(str(err).split("; give")[0])
    return LadderPlan(search, serve, trained, None, _probe_words(TEXT_NAME, options.alpha), " and ".join(why))


def _probe_words(where: str, alpha: float) -> str:
    """The probe in words, with the least break it can show (decision.LENGTH_MARGIN over enough blocks)."""
    from lpes.foundation.decision import LENGTH_MARGIN
    from lpes.validation.length_probe import detectable_blocks

    return (f"next-token loss on {where}, blocks of {BLOCK} tokens; a break is {LENGTH_MARGIN:g} nats/token or "
            f"more over at least {detectable_blocks(alpha)} blocks all worse")


def _prefix(text: str, tokens: int) -> str:
    """Enough of `text` for `tokens` tokens (about 4 characters each, 16 to spare), cut where a word ends."""
    return text if len(text) <= tokens * 16 else text[:tokens * 16].rsplit(None, 1)[0]


def _check_ladder_memory(config, serve: int, options: SearchOptions) -> None:
    """The probe's longest pass, one row of `serve` tokens with its KV cache, must fit (its activations are a
    chunk's at a time, so this errs on the safe side)."""
    from lpes.converter.loading import dtype_bytes
    from lpes.validation.sizes import check_forward_memory

    check_forward_memory(config, serve, serve, dtype_bytes(resolve_dtype(options)), _device_memory(options),
                         "--serve-length")


def _check_scheme_reaches(config, rope: RopeScheme, grid: ScaleGrid, longest: int) -> None:
    """Refuse a per-layer search in which every curve is the unscaled model (dynamic NTK within the trained
    length): it would spend its whole budget to write the model's own RoPE."""
    trained = getattr(config, "max_position_embeddings", None)
    if rope.linear or not all(StockRope(rope.rope_type, f).same_as_unscaled(longest, trained) for f in grid.values):
        return
    name = rope.name
    raise LpesError(f"--rope-type {rope.rope_type}: every calibration example is within the {trained:,} positions "
                    f"the model was trained for (the longest reaches {longest:,}), where {name} at any factor is the "
                    "unscaled model; calibrate on longer --data, or use --rope-type linear or yarn")


def _check_sizes(config, task, held_out_task, holdout: int, model: str) -> None:
    """What the config and the description decide before a prompt is built: a bundled task's length against
    the model's trained positions, and every prompt of the run (calibration and held out) against memory."""
    from lpes.validation.sizes import check_positions, check_prompt_memory

    if task.length is not None:  # a bundled model's task: `length` is the positions a prompt takes
        check_positions(config, task.length + (task.answer_tokens or 1), "--data", model,
                        "ask for a shorter length")
    check_prompt_memory([("--data", task), (f"--holdout {holdout}", held_out_task)])


def _check_longest(config, tokenizer, examples: list, model: str) -> None:
    """The longest calibration prompt, encoded, and its answer's budget within the positions lpes goes to."""
    from lpes.validation.sizes import check_positions

    longest = max(examples, key=lambda e: len(e.prompt))
    try:
        positions = _lengths(tokenizer, [longest])[0][1]
    except Exception:  # words the tokenizer lacks: check_vocabulary below says which, in its own words
        return
    check_positions(config, positions, "--data", model, "ask for fewer pairs or a shorter length")


def _device_memory(options: SearchOptions) -> int | None:
    """Bytes available on the devices the replicas run on (the least of them); None where unknown (Ray)."""
    import torch

    from lpes.converter.loading import available_memory
    from lpes.foundation.devices import requested_devices

    if options.ray is not None:  # the actors' machines are not this one
        return None
    devices = requested_devices(options.device)
    if devices[0].startswith("cuda"):
        return min(torch.cuda.mem_get_info(torch.device(d))[0] for d in devices)
    return available_memory()


def _check_forward_memory(config, longest: int, options: SearchOptions, greedy: bool) -> None:
    """The widest batch a replica scores must fit on its device with its KV cache (plan time, before a model
    is loaded): --batch-size rows, or where verdicts decode (an answer budget, --method greedy) the wide
    batches of WIDE_BATCHES x --batch-size rows (search/replica.py)."""
    from lpes.converter.loading import dtype_bytes
    from lpes.search.replica import WIDE_BATCHES
    from lpes.validation.scoring import MAX_BATCH_TOKENS
    from lpes.validation.sizes import batch_tokens, check_forward_memory

    wide = WIDE_BATCHES if greedy or options.method == "greedy" else 1
    tokens = batch_tokens(longest, wide * options.batch_size, wide * MAX_BATCH_TOKENS)
    check_forward_memory(config, longest, tokens, dtype_bytes(resolve_dtype(options)), _device_memory(options),
                         "--data")


def _check_backward_memory(config, lengths: list[int], options: SearchOptions) -> None:
    """A gradient search's backward must fit on its device (plan time, before a model is loaded)."""
    from lpes.converter.loading import dtype_bytes
    from lpes.search.gradient import check_backward_fits

    if options.ray is not None:  # the actors' machines are not this one
        return
    weight_bytes = dtype_bytes(resolve_dtype(options))
    # `lengths`: prompt + the answer's budget, at least the rows the objective runs (prompt + answer - 1).
    check_backward_fits(config, lengths, options.batch_size, weight_bytes, _device_memory(options))


def _lengths(tokenizer, examples: list) -> list[tuple[int, int]]:
    """Per example: prompt tokens, and positions with the answer's budget (the longest a verdict reaches)."""
    from lpes.validation.scoring import encode_examples

    return [(len(e.prompt_ids), len(e.prompt_ids) + (x.answer_tokens or len(e.answer_ids)))
            for e, x in zip(encode_examples(tokenizer, examples), examples, strict=True)]


def _held_out_task(task, holdout: int):
    """The task the held-out examples come from: generated data gets as many per gold index as --holdout takes
    (a file's half holds what it holds)."""
    if task.file is not None or task.examples_per_index is None:
        return task
    per_index = -(-holdout // max(1, len(task.resolved_gold_indices())))
    return replace(task, examples_per_index=max(task.examples_per_index, per_index))


def _held_out_examples(examples: list, count: int, notes: list[str] | None = None) -> list:
    """`_across_positions`, saying so in one line (in `notes`) when the data holds fewer than --holdout asks for."""
    if len(examples) < count and notes is not None:
        per_index = len(examples) // max(1, gold_count(examples))
        notes.append(f"--holdout {count}: the held-out data holds {len(examples)} examples ({per_index} per "
                     f"gold index x {gold_count(examples)}); using {len(examples)}")
    return _across_positions(examples, count)


def gold_count(examples: list) -> int:
    return max(1, len({e.gold_index for e in examples}))


def _across_positions(examples: list, count: int) -> list:
    """The first `count` examples taken in turn from each gold position (the data comes grouped by position)."""
    groups: dict[int, list] = {}
    for example in examples:
        groups.setdefault(example.gold_index, []).append(example)
    interleaved = [e for batch in zip_longest(*groups.values()) for e in batch if e is not None]
    return interleaved[:count]


def _tokenizer(model_path: Path):
    from lpes.converter.loading import load_tokenizer

    return load_tokenizer(model_path)
