"""lpes-validate: key-value retrieval accuracy by gold position, for every variant of a conversion.

Variants, in order:

- `unscaled`: the base model as it ships (PyTorch);
- `reference`: the same model patched with the spec (`converter.reference.apply`);
- every export found in the output folder (`EXPORT_VARIANTS`): the Hub folder
  (loaded with trust_remote_code), `onnx/` (onnxruntime), `genai/`
  (onnxruntime-genai), `tensorrt/` (TensorRT, on a GPU). An export that cannot
  run on this machine (no GPU, runtime not installed) is reported as skipped.

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
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpes.errors import LpesError
from lpes.spec import Spec, load_spec, write_text_atomic
from lpes.validation import scoring
from lpes.validation.examples import Example

FORMAT = "lpes-validation"
VERSION = 1
JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "validation.json", "validation.md", "validation.png"
REFERENCE = "reference"
UNSCALED = "unscaled"
UNIFORM = "best uniform"
# Share of examples on which an export may decode differently from the reference. float32
# runtimes differ only in rounding, far below the logit gaps of a greedy choice; half
# precision moves logits by ~1e-3 relative and flips a near-tie now and then.
MAX_DISAGREEMENT = {"float32": 0.0, "float16": 0.02, "bfloat16": 0.05}


class VariantUnavailable(Exception):
    """An export is present but cannot run here (no GPU, runtime not installed, no runner yet)."""


@dataclass(frozen=True)
class ExportVariant:
    """How to find one kind of export in the output folder and how to score it."""

    folder: str  # relative to the output folder; "." is the folder itself
    markers: tuple[str, ...]  # glob patterns; the export is there when any matches
    load: Callable[[Path, str], Any]  # (folder, reference dtype) -> transformers model or GreedyRunner

    def find(self, out_dir: Path) -> Path | None:
        folder = out_dir / self.folder
        return folder if any(any(folder.glob(m)) for m in self.markers) else None


def _load_hf(folder: Path, dtype: str):
    from transformers import AutoModelForCausalLM

    from lpes.converter.loading import DTYPES

    # The Hub folder's own modeling_lpes.py + lpes_rope.py: what a user of the folder runs.
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=DTYPES[dtype])
    return model.eval()


def _load_onnx(folder: Path, dtype: str):
    _require("onnxruntime", "onnx")
    from lpes.validation.ort_runner import OrtCausalLM, check_dtype_supported

    try:
        check_dtype_supported(export_dtype(folder) or "float32")
    except LpesError as why:  # bfloat16 without a GPU: the export may be fine, this machine cannot run it
        raise VariantUnavailable(str(why)) from None
    return OrtCausalLM(folder)


def _load_genai(folder: Path, dtype: str):
    _require("onnxruntime_genai", "genai")
    from lpes.validation.genai_runner import GenaiGreedy

    return GenaiGreedy(folder)


def _load_tensorrt(folder: Path, dtype: str):
    _require("tensorrt", "tensorrt")
    import torch

    if not torch.cuda.is_available():  # engines run on the GPU they were built for
        raise VariantUnavailable("a TensorRT engine needs an NVIDIA GPU and a CUDA build of torch")
    from lpes.validation.trt_runner import TrtCausalLM

    return TrtCausalLM(folder)


def _require(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise VariantUnavailable(f"{module} is not installed (pip install 'lpes[{extra}]')")


EXPORT_VARIANTS: dict[str, ExportVariant] = {
    "hf": ExportVariant(".", ("modeling_lpes.py",), _load_hf),
    "onnx": ExportVariant("onnx", ("model.onnx",), _load_onnx),
    "tensorrt": ExportVariant("tensorrt", ("model.engine",), _load_tensorrt),
    "genai": ExportVariant("genai", ("genai_config.json",), _load_genai),
}


@dataclass
class VariantResult:
    name: str
    status: str  # "ok" or "skipped"
    scores: scoring.Scores | None = None
    note: str = ""  # the runtime (e.g. the ONNX Runtime provider) or why it was skipped
    dtype: str | None = None
    disagreements: list[int] = field(default_factory=list)  # example ids that differ from the reference
    allowed: int | None = None  # None: not compared (the torch variants)

    @property
    def passed(self) -> bool:
        return self.allowed is None or len(self.disagreements) <= self.allowed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "note": self.note}
        if self.scores is not None:
            out["accuracy"] = self.scores.accuracy
            out["accuracy_by_gold_index"] = {str(k): v for k, v in self.scores.accuracy_by_gold_index().items()}
            out["forward_tokens"] = self.scores.forward_tokens
        if self.allowed is not None:
            out.update(dtype=self.dtype, disagreements=self.disagreements, allowed=self.allowed, passed=self.passed)
        return out


@dataclass
class ValidationReport:
    model: str
    examples: list[Example]
    variants: list[VariantResult]
    max_new_tokens: int | None
    files: list[Path] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.variants)

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
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "passed": self.passed,
            "num_examples": len(self.examples),
            "gold_indices": self.gold_indices,
            "max_new_tokens": self.max_new_tokens,
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
        lines += ["", f"![accuracy by gold index]({PLOT_FILE})", ""]
        lines.append("**passed**" if self.passed else "**FAILED**: " + "; ".join(self.failures()))
        return "\n".join(lines) + "\n"

    def format(self) -> str:
        """What the CLI prints: the table, the verdict, and where the files are."""
        text = self.markdown().replace(f"\n![accuracy by gold index]({PLOT_FILE})\n", "")
        if self.files:
            text += "wrote " + ", ".join(str(p) for p in self.files) + "\n"
        return text


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
    max_new_tokens: int | None = None,
    variants: Sequence[str] | None = None,
    device: str | None = None,
    progress: bool = True,
) -> ValidationReport:
    """Score the unscaled model, the LPES reference and every export in `out_dir`; write the report files.

    `spec` None: read `out_dir/lpes_spec.json` (or `out_dir/onnx/lpes_spec.json`).
    `examples` None: `tasks.load_examples(model_path, data, use_chat_template=chat_template)`.
    `variants` limits the exports scored (names of `EXPORT_VARIANTS`); None: all found.
    An export's dtype (which sets its disagreement threshold) is read from its
    folder (`lpes_onnx.json` ...), else float32. The torch variants run in
    `reference_dtype` on `device` (default: cuda when available).
    """
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    spec = spec if spec is not None else find_spec(out_dir)
    tokenizer = _load_tokenizer(model_path)
    if examples is None:
        from lpes.validation.tasks import load_examples

        examples = load_examples(model_path, data, tokenizer=tokenizer, use_chat_template=chat_template)
    examples = list(examples)
    if not examples:
        raise LpesError("validation needs at least one example")
    exports = _found_exports(out_dir, variants)
    torch_variants = 3 if "best_uniform_scale" in spec.provenance.get("search", {}) else 2
    total = len(examples) * (torch_variants + len(exports))
    bar = tqdm(total=total, desc="lpes-validate", unit="example", disable=not progress)

    def score(name: str, model, eos) -> scoring.Scores:
        bar.set_postfix_str(name)
        return scoring.greedy_correct(
            model, tokenizer, examples, batch_size, max_new_tokens, progress=bar.update, eos_token_id=eos
        )

    results, eos = _score_torch(model_path, spec, tokenizer, reference_dtype, device, score)
    reference = results[-1]
    for name, folder in exports:
        results.append(_score_export(name, folder, reference, reference_dtype, device, eos, score))
        if results[-1].status != "ok":
            bar.update(len(examples))
    bar.close()
    report = ValidationReport(str(model_path), examples, results, max_new_tokens)
    write_report(report, out_dir)
    return report


def _score_torch(model_path: Path, spec: Spec, tokenizer, dtype: str, device: str | None, score):
    """The unscaled model, then the same weights patched in place: one load for both."""
    from lpes.converter.loading import load_model
    from lpes.converter.reference import apply

    model = load_model(Path(model_path), dtype).to(_device(device))
    eos = scoring.eos_token_ids(model, tokenizer)  # the exports' runners get the same stop tokens
    results = [VariantResult(UNSCALED, "ok", score(UNSCALED, model, eos or None))]
    uniform = spec.provenance.get("search", {}).get("best_uniform_scale")
    if uniform is not None:  # the baseline a per-layer curve must beat, found by lpes-search
        apply(model, Spec.from_scales([uniform] * len(spec.scales)))
        name = f"{UNIFORM} s={uniform:g}"
        results.append(VariantResult(name, "ok", score(name, model, eos or None)))
    apply(model, spec)
    results.append(VariantResult(REFERENCE, "ok", score(REFERENCE, model, eos or None)))
    del model
    return results, eos


def _score_export(name, folder, reference: VariantResult, torch_dtype, device, eos, score) -> VariantResult:
    try:
        runner = EXPORT_VARIANTS[name].load(folder, torch_dtype)
    except VariantUnavailable as why:
        return VariantResult(name, "skipped", note=str(why))
    if hasattr(runner, "greedy"):
        note = str(getattr(runner, "provider", "") or type(runner).__name__)
        dtype = export_dtype(folder) or getattr(runner, "dtype", None) or "float32"
    else:  # a torch model: same device and dtype as the reference
        runner, note, dtype = runner.to(_device(device)), "PyTorch, trust_remote_code", torch_dtype
    scores = score(name, runner, eos or None)
    differ = [
        r.example_id
        for r, ref in zip(scores.results, reference.scores.results, strict=True)
        if r.generated != ref.generated
    ]
    allowed = int(MAX_DISAGREEMENT.get(dtype, 0.0) * len(scores.results))
    return VariantResult(name, "ok", scores, note, dtype, differ, allowed)


def _found_exports(out_dir: Path, names: Sequence[str] | None) -> list[tuple[str, Path]]:
    if names is not None:
        unknown = [n for n in names if n not in EXPORT_VARIANTS]
        if unknown:
            raise LpesError(f"unknown variant {unknown[0]!r} (known: {', '.join(EXPORT_VARIANTS)})")
    found = []
    for name, variant in EXPORT_VARIANTS.items():
        folder = variant.find(out_dir)
        if folder is not None and (names is None or name in names):
            found.append((name, folder))
    return found


def export_dtype(folder: Path) -> str | None:
    """The dtype an exporter recorded in its sidecar (`lpes_onnx.json`, ...), if any."""
    for path in sorted(folder.glob("lpes_*.json")):
        if path.name == "lpes_spec.json":
            continue
        try:
            dtype = json.loads(path.read_text()).get("dtype")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            continue
        if isinstance(dtype, str):
            return dtype
    return None


def find_spec(out_dir: Path) -> Spec:
    for candidate in (out_dir / "lpes_spec.json", out_dir / "onnx" / "lpes_spec.json"):
        if candidate.is_file():
            return load_spec(candidate)
    raise LpesError(f"no lpes_spec.json in {out_dir} (nor in its onnx/); is it an lpes-convert output folder?")


def _device(device: str | None):
    import torch

    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _load_tokenizer(model_path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as err:
        raise LpesError(f"cannot load the tokenizer of {model_path}: {str(err).splitlines()[0]}") from None


# ---- files ----


def write_report(report: ValidationReport, out_dir: Path) -> list[Path]:
    """validation.json, validation.md, validation.png in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    json_path, md_path, png_path = out_dir / JSON_FILE, out_dir / MARKDOWN_FILE, out_dir / PLOT_FILE
    write_text_atomic(json_path, json.dumps(report.to_json(), indent=1) + "\n")
    write_text_atomic(md_path, report.markdown())
    plot_accuracy(report, png_path)
    report.files = [json_path, md_path, png_path]
    return report.files


def plot_accuracy(report: ValidationReport, path: Path) -> Path:
    """Accuracy against gold index, one line per scored variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    styles = {UNSCALED: ("o--", "gray"), REFERENCE: ("s-", "C0")}
    for n, v in enumerate(report.variants):
        if v.scores is None:
            continue
        by_index = v.scores.accuracy_by_gold_index()
        style, color = styles.get(v.name, ("^:", f"C{n}"))
        ax.plot(list(by_index), [100 * a for a in by_index.values()], style, color=color, label=v.name)
    ax.set_xticks(report.gold_indices)
    ax.set_xlabel("gold index (position of the needed pair)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-3, 103)
    ax.set_title("Key-value retrieval by position")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path
