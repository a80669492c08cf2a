"""lpes-validate: key-value retrieval accuracy by gold position, for every variant of a conversion.

Variants, in order:

- `unscaled`: the base model as it ships (PyTorch);
- the baselines the search recorded in the spec, each at its best on the calibration set:
  `best uniform s=S` (one linear scale for every layer) and the stock length-extension
  RoPE types every runtime has, `YaRN f=F` and `dynamic NTK f=F` (transformers' own
  rotary, `converter.reference.use_stock_rope`; dynamic NTK one example at a time, since
  its frequencies follow the sequence length);
- `reference`: the same model patched with the spec (`converter.reference.apply`);
- every export found in the output folder, one per registered target
  (`lpes.exporters.targets`): the Hub folder (its own code, checked byte for byte
  first), `onnx/` (onnxruntime), `genai/` (onnxruntime-genai), `tensorrt/`
  (TensorRT, on a GPU). An export that cannot run on this machine (no GPU, runtime
  not installed) is reported as skipped.

Every variant decodes greedily on the same examples (`scoring.greedy_correct`). An
export passes when its greedy output differs from the reference's on no more
examples than its dtype allows (`MAX_DISAGREEMENT`: none in float32). The report
keeps every example's output per variant, and the prompt of every example on
which an export disagrees, so a disagreement can be replayed.

Writes into the output folder: `validation.json` (everything), `validation.md`
(the table and the plot, embedded in the model card) and `validation.png`
(accuracy against gold index, one line per variant).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpes import plots
from lpes.errors import LpesError
from lpes.exporters.targets import RunContext, RunnerUnavailable, registry
from lpes.spec import Spec, load_spec, write_text_atomic
from lpes.validation import checks, scoring
from lpes.validation.examples import Example

if TYPE_CHECKING:
    from lpes.converter.model_card import Measured

FORMAT = "lpes-validation"
VERSION = 1
JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "validation.json", "validation.md", "validation.png"
REFERENCE = "reference"
UNSCALED = "unscaled"
UNIFORM = "best uniform"
BASELINE_NOTE = "PyTorch, best on calibration"
# Share of examples on which an export may decode differently from the reference. float32
# runtimes differ only in rounding, far below the logit gaps of a greedy choice; half
# precision moves logits by ~1e-3 relative and flips a near-tie now and then.
MAX_DISAGREEMENT = {"float32": 0.0, "float16": 0.02, "bfloat16": 0.05}
DEFAULT_MAX_SECONDS = 20 * 60  # key-value scoring longer than this (estimated) is left to lpes-validate
MAX_ROPE_POSITIONS = 32768  # the RoPE check's positions (it allocates positions x head_dim per scale)
# LPES below the unscaled model by more than this share of examples is reported as harm, not noise.
WORSE_MARGIN = 0.02


@dataclass
class VariantResult:
    name: str
    status: str  # "ok" or "skipped"
    scores: scoring.Scores | None = None
    note: str = ""  # the runtime (e.g. the ONNX Runtime provider) or why it was skipped
    dtype: str | None = None
    disagreements: list[int] = field(default_factory=list)  # example ids that differ from the reference
    allowed: int | None = None  # None: not compared (the torch variants)
    baseline: bool = False  # a stock way of scaling (uniform, YaRN, dynamic NTK) the curve is held against

    @property
    def passed(self) -> bool:
        return self.allowed is None or len(self.disagreements) <= self.allowed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "note": self.note, "baseline": self.baseline}
        if self.scores is not None:
            out["accuracy"] = self.scores.accuracy
            out["accuracy_by_gold_index"] = {str(k): v for k, v in self.scores.accuracy_by_gold_index().items()}
            out["forward_tokens"] = self.scores.forward_tokens
        if self.allowed is not None:
            out.update(dtype=self.dtype, disagreements=self.disagreements, allowed=self.allowed, passed=self.passed)
        return out


@dataclass
class ValidationReport:
    model: str  # as the user named it (a Hub id or a folder's name), never a path of this machine
    examples: list[Example]
    variants: list[VariantResult]
    max_new_tokens: int | None
    checks: list[checks.Check] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # per example, as scored (the plot's caption)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.variants) and all(c.passed for c in self.checks)

    def harm(self) -> str | None:
        """A plain sentence when the LPES curve makes the model worse than it was unscaled."""
        names = {v.name for v in self.variants if v.scores is not None}
        if not {UNSCALED, REFERENCE} <= names:
            return None
        before, after = self.variant(UNSCALED).scores.accuracy, self.variant(REFERENCE).scores.accuracy
        if after >= before - WORSE_MARGIN:
            return None
        return (f"the LPES curve makes this model WORSE: {100 * after:.1f}% with it, {100 * before:.1f}% "
                "unscaled (the exports agreeing with the reference does not make the curve good)")

    def beaten(self) -> str | None:
        """A plain sentence when a baseline answers more examples than the LPES curve does."""
        scored = [v for v in self.variants if v.scores is not None]
        lpes = next((v for v in scored if v.name == REFERENCE), None)
        better = [v for v in scored if v.baseline and lpes is not None and _right(v) > _right(lpes)]
        if not better:
            return None
        best = max(better, key=_right)
        return (f"{', '.join(v.name for v in better)} answer{'s' if len(better) == 1 else ''} more examples than "
                f"the LPES curve ({best.name}: {100 * best.scores.accuracy:.1f}%, LPES: "
                f"{100 * lpes.scores.accuracy:.1f}%); on this task that stock setting is the better choice")

    @property
    def gold_indices(self) -> list[int]:
        return sorted({e.gold_index for e in self.examples})

    def variant(self, name: str) -> VariantResult:
        return next(v for v in self.variants if v.name == name)

    def failures(self) -> list[str]:
        return [
            f"{v.name} decodes differently from the reference on {len(v.disagreements)} of "
            f"{len(self.examples)} examples ({v.dtype}: at most {v.allowed} allowed)"
            for v in self.variants
            if not v.passed
        ] + [f"{c.name}: {c.detail}" for c in self.checks if c.name != "kv" and not c.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "passed": self.passed,
            "num_examples": len(self.examples),
            "gold_indices": self.gold_indices,
            "max_new_tokens": self.max_new_tokens,
            "checks": [c.to_json() for c in self.checks],
            "harm": self.harm(),
            "beaten": self.beaten(),
            "variants": [v.to_json() for v in self.variants],
            "examples": self._examples_json(),
        }

    def _examples_json(self) -> list[dict[str, Any]]:
        scored = [v for v in self.variants if v.scores is not None]
        disagreeing = {i for v in self.variants for i in v.disagreements}
        rows = []
        for i, example in enumerate(self.examples):
            row: dict[str, Any] = {"id": i, "gold_index": example.gold_index, "answer": example.answer}
            row["generated"] = {v.name: v.scores.results[i].generated for v in scored}
            row["correct"] = {v.name: v.scores.results[i].correct for v in scored}
            if i in disagreeing:
                row["prompt"] = example.prompt  # to replay the disagreement
            rows.append(row)
        return rows

    def markdown(self) -> str:
        lines = ["Checks:", ""] + [f"- {c.line()}" for c in self.checks] + [""]
        if self.variants:
            lines += self._table()
        if self.harm():
            lines += [f"**Warning**: {self.harm()}.", ""]
        if self.beaten():
            lines += [f"**Note**: {self.beaten()}.", ""]
        lines.append("**passed**" if self.passed else "**FAILED**: " + "; ".join(self.failures()))
        return "\n".join(lines) + "\n"

    def _table(self) -> list[str]:
        gold = self.gold_indices
        per_index = len(self.examples) // max(len(gold), 1)
        lines = [
            f"Key-value retrieval accuracy (%) by gold index (position of the needed pair, 0 = first), "
            f"{per_index} examples per index, greedy decoding.",
            "",
            "| variant | " + " | ".join(str(g) for g in gold) + " | all | vs reference |",
            "|---|" + "---:|" * (len(gold) + 1) + "---|",
        ]
        for v in self.variants:
            lines.append(_markdown_row(v, gold, len(self.examples)))
        return lines + ["", f"![accuracy by gold index]({PLOT_FILE})", ""]

    def measured(self) -> Measured | None:
        """The numbers the model card states; None when key-value scoring did not run."""
        from lpes.converter.model_card import Accuracy, Measured

        scored = {v.name: v for v in self.variants if v.scores is not None}
        if UNSCALED not in scored or REFERENCE not in scored:
            return None

        def accuracy(v: VariantResult) -> Accuracy:
            return Accuracy(v.scores.accuracy, v.scores.accuracy_by_gold_index())

        uniform = next((v for name, v in scored.items() if name.startswith(UNIFORM)), None)
        exports = [v for v in scored.values() if v.allowed is not None]
        lengths = (min(self.prompt_tokens), max(self.prompt_tokens)) if self.prompt_tokens else (0, 0)
        stock = tuple((v.name, accuracy(v)) for v in scored.values() if v.baseline and v is not uniform)
        return Measured(len(self.examples), self.examples[0].num_pairs, lengths, accuracy(scored[UNSCALED]),
                        accuracy(scored[REFERENCE]), accuracy(uniform) if uniform else None,
                        tuple(v.name for v in exports if v.passed), tuple(v.name for v in exports if not v.passed),
                        stock)

    def format(self) -> str:
        """What the CLI prints: the table, the verdict, and where the files are."""
        return self.markdown().replace(f"\n![accuracy by gold index]({PLOT_FILE})\n", "")


def _right(v: VariantResult) -> int:
    return sum(r.correct for r in v.scores.results)


def _markdown_row(v: VariantResult, gold: list[int], total: int) -> str:
    label = {UNSCALED: "unscaled (PyTorch)", REFERENCE: "LPES reference (PyTorch)"}.get(v.name, v.name)
    if v.note and v.status == "ok":
        label += f" ({v.note})"
    if v.scores is None:
        return f"| {label} | " + " | ".join("-" for _ in gold) + f" | - | skipped: {v.note} |"
    by_index = v.scores.accuracy_by_gold_index()
    cells = [f"{100 * by_index[g]:.1f}" if g in by_index else "-" for g in gold]
    cells.append(f"{100 * v.scores.accuracy:.1f}")
    if v.allowed is None:
        versus = ""
    else:
        verdict = "ok" if v.passed else "**FAIL**"
        versus = f"{len(v.disagreements)}/{total} differ ({v.dtype}, allowed {v.allowed}): {verdict}"
    return f"| {label} | " + " | ".join(cells) + f" | {versus} |"


def validate(
    model_path: Path,
    out_dir: Path,
    spec: Spec | None = None,
    examples: Sequence[Example] | None = None,
    *,
    data: str | None = None,
    chat_template: bool = True,
    reference_dtype: str = "float32",
    batch_size: int = 8,
    max_batch_tokens: int = scoring.MAX_BATCH_TOKENS,
    max_new_tokens: int | None = None,
    variants: Sequence[str] | None = None,
    device: str | None = None,
    max_seconds: float | None = DEFAULT_MAX_SECONDS,
    model_name: str | None = None,
    shown_dir: Path | None = None,
    progress: bool = True,
) -> ValidationReport:
    """Check the RoPE of every layer, then score the unscaled model, the LPES reference and every export.

    `spec` None: read `out_dir/lpes_spec.json` (or `out_dir/onnx/lpes_spec.json`).
    `examples` None: `tasks.load_examples(model_path, data, use_chat_template=chat_template)`.
    `variants` limits the exports scored (target names); None: all found.
    The key-value scoring runs only when there is a tokenizer, the weights fit in
    memory and the estimated time is within `max_seconds` (None: no limit); else the
    report says why it was skipped and how to run it (`lpes-validate` names
    `shown_dir`, the folder as the user will see it). The torch variants run in
    `reference_dtype` on `device` (default: cuda when available).
    """
    from lpes.converter.loading import load_config, model_label

    out_dir = Path(out_dir)
    spec = spec if spec is not None else find_spec(out_dir)
    config = load_config(Path(model_path))
    spec = spec.for_layers(config.num_hidden_layers)
    name = model_label(str(model_name or spec.provenance.get("base_model") or Path(model_path).name))
    rerun = f"lpes-validate {shown_dir or out_dir} --model {name}"
    exports = _found_exports(out_dir, variants)
    kv_plan = _plan_kv(model_path, config, examples, data, chat_template, reference_dtype, device,
                       2 + len(exports) + _baseline_count(spec), max_seconds)
    longest = max(kv_plan.prompt_tokens, default=0) + 64  # the prompts plus the answers' tokens
    rope = checks.rope_check(config, spec, max(_positions_to_check(config, spec), longest))
    results: list[VariantResult] = []
    if kv_plan.skipped is None:
        results = _score_all(model_path, spec, kv_plan, exports, reference_dtype, device, batch_size,
                             max_batch_tokens, max_new_tokens, progress)
        verdict = "passed" if all(v.passed for v in results) else "failed"
        kv = checks.Check("kv", verdict, f"{len(kv_plan.examples)} examples, {kv_plan.estimate}")
    else:
        kv = checks.Check("kv", "skipped", f"{kv_plan.skipped}; to run it where it fits: {rerun}")
    report = ValidationReport(name, kv_plan.examples, results, max_new_tokens, [rope, kv],
                              prompt_tokens=kv_plan.prompt_tokens if results else [])
    write_report(report, out_dir)
    return report


@dataclass
class KvPlan:
    skipped: str | None  # why key-value scoring does not run here; None: it runs
    tokenizer: Any = None
    examples: list[Example] = field(default_factory=list)
    estimate: str = ""
    prompt_tokens: list[int] = field(default_factory=list)  # per example (also when skipped for time)
    variants: int = 0  # models each example is scored on


def _baseline_count(spec: Spec) -> int:
    return int(spec.best_uniform_scale is not None) + len(spec.stock_baselines)


def _positions_to_check(config, spec: Spec) -> int:
    """Every position the model is used at: its trained length times the largest scale (capped)."""
    trained = int(getattr(config, "max_position_embeddings", 0) or 4096)
    return min(MAX_ROPE_POSITIONS, max(trained, int(trained * max(spec.scales))))


def _plan_kv(model_path: Path, config, examples, data, chat_template, dtype, device, variants, max_seconds) -> KvPlan:
    """Whether key-value scoring fits here: a tokenizer, memory for the weights, time within the budget."""
    from lpes.converter.loading import DTYPES, available_memory, has_tokenizer, load_tokenizer, parameter_count

    if not has_tokenizer(model_path):
        return KvPlan(f"{Path(model_path).name} has no tokenizer files, so no prompts can be built")
    params = parameter_count(model_path)
    needed = params * DTYPES[dtype].itemsize
    available = available_memory()
    if available is not None and needed > checks.MEMORY_SHARE * available:
        return KvPlan(f"the weights take {checks.format_bytes(needed)} in {dtype}; this machine has "
                      f"{checks.format_bytes(available)} available")
    tokenizer = load_tokenizer(model_path)
    if examples is None:
        from lpes.validation.tasks import load_examples

        examples = load_examples(model_path, data, tokenizer=tokenizer, use_chat_template=chat_template)
    examples = list(examples)
    if not examples:
        raise LpesError("validation needs at least one example")
    encoded = scoring.encode_examples(tokenizer, examples)
    lengths = [len(e.prompt_ids) + len(e.answer_ids) for e in encoded]
    where = _device(device)
    rate = checks.EFFICIENCY * checks.matmul_rate(where, DTYPES[dtype])
    seconds = variants * checks.forward_flops(params, config, lengths) / rate
    estimate = f"about {checks.format_seconds(seconds)} on {where.type} (estimated)"
    if max_seconds is not None and seconds > max_seconds:
        return KvPlan(f"{len(examples)} examples x {variants} variants would take {estimate}, "
                      f"over the {checks.format_seconds(max_seconds)} budget",
                      prompt_tokens=[len(e.prompt_ids) for e in encoded])
    return KvPlan(None, tokenizer, examples, estimate, [len(e.prompt_ids) for e in encoded], variants)


def _score_all(model_path, spec, kv_plan: KvPlan, exports, reference_dtype, device, batch_size, max_batch_tokens,
               max_new_tokens, progress) -> list[VariantResult]:
    from tqdm.auto import tqdm

    tokenizer, examples = kv_plan.tokenizer, kv_plan.examples
    bar = tqdm(total=len(examples) * kv_plan.variants, desc="lpes-validate", unit="example", disable=not progress)

    def score(name: str, model, eos, one_at_a_time: bool = False) -> scoring.Scores:
        bar.set_postfix_str(name)
        return scoring.greedy_correct(model, tokenizer, examples, 1 if one_at_a_time else batch_size, max_new_tokens,
                                      progress=bar.update, eos_token_id=eos, max_batch_tokens=max_batch_tokens)

    results, eos = _score_torch(model_path, spec, tokenizer, reference_dtype, device, score,
                                skip=lambda: bar.update(len(examples)))
    reference = results[-1]
    run = RunContext(reference_dtype, str(_device(device)), scoring.pad_token_id(None, tokenizer))
    for name, folder in exports:
        results.append(_score_export(name, folder, reference, run, eos, score))
        if results[-1].status != "ok":
            bar.update(len(examples))
    bar.close()
    return results


def _score_torch(model_path: Path, spec: Spec, tokenizer, dtype: str, device: str | None, score, skip):
    """The unscaled model, the baselines, then the curve: the same weights, changed in place, one load for all."""
    from lpes.converter.loading import load_model
    from lpes.converter.reference import apply, stock_rope_unsupported, use_stock_rope

    model = load_model(Path(model_path), dtype).to(_device(device))
    eos = scoring.eos_token_ids(model, tokenizer) or None  # the exports' runners get the same stop tokens
    results = [VariantResult(UNSCALED, "ok", score(UNSCALED, model, eos))]
    uniform = spec.best_uniform_scale
    if uniform is not None:  # the baselines a per-layer curve must beat, found by lpes-search
        apply(model, Spec.from_scales([uniform] * len(spec.scales)))
        name = f"{UNIFORM} s={uniform:g}"
        results.append(VariantResult(name, "ok", score(name, model, eos), BASELINE_NOTE, baseline=True))
    for rope in spec.stock_baselines:
        why = stock_rope_unsupported(model.config, rope.rope_type)  # a spec searched on another model
        if why:
            results.append(VariantResult(rope.name, "skipped", note=why, baseline=True))
            skip()  # the progress bar counted its examples
            continue
        use_stock_rope(model, rope)
        note = f"{BASELINE_NOTE}, one example at a time" if rope.length_dependent else BASELINE_NOTE
        scores = score(rope.name, model, eos, rope.length_dependent)
        results.append(VariantResult(rope.name, "ok", scores, note, baseline=True))
    apply(model, spec)
    results.append(VariantResult(REFERENCE, "ok", score(REFERENCE, model, eos)))
    del model
    return results, eos


def _score_export(name, folder, reference: VariantResult, run: RunContext, eos, score) -> VariantResult:
    target = registry()[name]
    try:
        opened = target.open(folder, run)
    except RunnerUnavailable as why:
        return VariantResult(name, "skipped", note=str(why))
    scores = score(name, opened.runner, eos or None)
    differ = [
        r.example_id
        for r, ref in zip(scores.results, reference.scores.results, strict=True)
        if r.generated != ref.generated
    ]
    # Held to the looser of the two precisions: a bfloat16 reference flips near-ties too.
    share = max(MAX_DISAGREEMENT.get(opened.dtype, 0.0), MAX_DISAGREEMENT.get(run.reference_dtype, 0.0))
    allowed = int(share * len(scores.results))
    return VariantResult(name, "ok", scores, opened.note, opened.dtype, differ, allowed)


def _found_exports(out_dir: Path, names: Sequence[str] | None) -> list[tuple[str, Path]]:
    targets = registry()
    if names is not None:
        unknown = [n for n in names if n not in targets]
        if unknown:
            raise LpesError(f"unknown variant {unknown[0]!r} (known: {', '.join(targets)})")
    found = []
    for name, target in targets.items():
        folder = target.find(out_dir)
        if folder is not None and (names is None or name in names):
            found.append((name, folder))
    return found


def find_spec(out_dir: Path) -> Spec:
    for candidate in (out_dir / "lpes_spec.json", out_dir / "onnx" / "lpes_spec.json"):
        if candidate.is_file():
            return load_spec(candidate)
    raise LpesError(f"no lpes_spec.json in {out_dir} (nor in its onnx/); is it an lpes-convert output folder?")


def _device(device: str | None):
    import torch

    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


# ---- files ----


def write_report(report: ValidationReport, out_dir: Path) -> list[Path]:
    """validation.json, validation.md, validation.png in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    json_path, md_path, png_path = out_dir / JSON_FILE, out_dir / MARKDOWN_FILE, out_dir / PLOT_FILE
    write_text_atomic(json_path, json.dumps(report.to_json(), indent=1) + "\n")
    write_text_atomic(md_path, report.markdown())
    report.files = [json_path, md_path]
    if any(v.scores is not None for v in report.variants):
        plots.plot_accuracy(report, png_path)
        report.files.append(png_path)
    return report.files
