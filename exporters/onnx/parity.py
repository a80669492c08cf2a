"""Parity of an ONNX export with the PyTorch reference (the model patched by `converter.reference`).

Identical inputs go into both: random prompts of 1 and 64 tokens, batch 1 and batch 3
with left padding. For each case:

- prefill logits at every real (unpadded) position: max absolute error, max error
  relative to the largest reference logit, top-1 agreement;
- greedy generation of `num_tokens` tokens: transformers' own `generate` (its cache,
  its position handling) against `OrtCausalLM.greedy` through the exported KV cache.
  Tokens must be identical; the logits of every step are compared too.

A top-1 difference is excused only at a near-tie: when the reference's own margin
between the two tokens is within the dtype's tolerance, precision cannot decide it
(and in float32 that tolerance is 1e-4). Generation of that row stops being compared there.

Finally, where the spec differs from the *unscaled* model, the export must differ from it by more
than the tolerance, so an export that silently lost the scales fails. It is compared at a length
where the spec differs (`unscaled_length`): the 64-token prompt for linear and YaRN scales other
than 1; for dynamic NTK, which is the unscaled model up to max_position_embeddings (N) at any
factor, a prompt of max(64, 2N) positions, where the export must also match the reference. Where
that prompt would be longer than MAX_UNSCALED_POSITIONS (a real model, N in the thousands), where
every scale is 1 under linear or YaRN (the unscaled model itself), or where the reference itself is
within the tolerance of the unscaled model there (a scale of 1.001 in float16), the report says the
check does not apply, and why: a correct export never fails it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from lpes.converter.loading import ResolvedModel, load_model
from lpes.converter.reference import apply
from lpes.exporters.onnx.runner import OrtCausalLM
from lpes.exporters.runners import left_pad
from lpes.foundation.spec import Spec


@dataclass(frozen=True)
class Tolerance:
    """Logits agree when |onnx - reference| <= atol + rtol * max|reference|."""

    atol: float
    rtol: float

    def bound(self, reference: np.ndarray) -> float:
        return self.atol + self.rtol * float(np.abs(reference).max())


TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-5),
    "float16": Tolerance(atol=2e-2, rtol=1e-2),
    "bfloat16": Tolerance(atol=1e-1, rtol=3e-2),
}
# (name, prompt lengths): single token, long prefill, and a left-padded batch whose
# shortest row (1 token behind 63 pads) is the hardest case for masks and positions.
CASES = (
    ("prefill 1, batch 1", (1,)),
    ("prefill 64, batch 1", (64,)),
    ("prefill 1, batch 3", (1, 1, 1)),
    ("prefill 64, batch 3, left padding", (64, 40, 1)),
)
CASE_LENGTH = max(max(lengths) for _, lengths in CASES)  # the longest prompt of the cases
LONG_CASE = "prefill 64, batch 1"  # where the unscaled model is compared: the farthest positions
# The longest prompt the unscaled comparison prefills (dynamic NTK past its trained length): a few times the
# cases' own work on a tiny model; a real model's 2 x max_position_embeddings would cost minutes and gigabytes.
MAX_UNSCALED_POSITIONS = 1024


@dataclass
class CaseResult:
    name: str
    prompt_lengths: list[int]
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    bound: float = 0.0
    top1_compared: int = 0
    top1_matches: int = 0
    top1_sure_mismatches: int = 0  # top-1 differs although the reference's margin exceeds the bound
    tokens_identical: bool = True
    # Per row: the first generated position where the tokens differ (None: identical).
    first_divergence: list[int | None] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def top1_agreement(self) -> float:
        return self.top1_matches / self.top1_compared if self.top1_compared else 1.0


@dataclass
class ParityReport:
    passed: bool
    provider: str
    dtype: str
    model_path: str
    onnx_dir: str
    num_tokens: int
    tolerance: dict
    scales: list[float]
    cases: list[CaseResult]
    max_abs_error: float
    max_rel_error: float
    # max |onnx - unscaled reference| at `unscaled_positions`; None where the check does not apply.
    unscaled_difference: float | None
    failures: list[str]
    unscaled_positions: int | None = None  # the prompt length compared (None: the check did not apply)
    unscaled_note: str = ""  # why it did not apply; or, past the cases' lengths, the error against the reference

    def to_json(self) -> dict:
        out = asdict(self)
        for case, data in zip(self.cases, out["cases"]):
            data["top1_agreement"] = case.top1_agreement
        return out

    def format(self) -> str:
        tol = self.tolerance
        lines = [
            f"ONNX parity: {'PASSED' if self.passed else 'FAILED'}  (onnxruntime {self.provider}, {self.dtype}; "
            f"logits must agree within {tol['atol']:g} + {tol['rtol']:g} x max|logit|)",
            f"  reference {self.model_path}   export {self.onnx_dir}",
            f"  {'case':<36}{'max abs':>10}{'max rel':>10}{'top-1':>9}   greedy {self.num_tokens}",
        ]
        for case in self.cases:
            greedy = "identical" if case.tokens_identical else _divergence_text(case.first_divergence)
            lines.append(
                f"  {case.name:<36}{case.max_abs_error:>10.2e}{case.max_rel_error:>10.2e}"
                f"{case.top1_agreement:>9.1%}   {greedy}"
            )
        if self.unscaled_difference is None:
            lines.append(f"  export vs unscaled model: does not apply: {self.unscaled_note}")
        else:
            note = f"; {self.unscaled_note}" if self.unscaled_note else ""
            lines.append(f"  export vs unscaled model at {self.unscaled_positions} positions: max |logit difference| "
                         f"{self.unscaled_difference:.3g}{note}")
        lines += [f"  FAIL: {failure}" for failure in self.failures]
        return "\n".join(lines)


def _divergence_text(first: list[int | None]) -> str:
    steps = [f"row {row}: step {step}" for row, step in enumerate(first) if step is not None]
    return "differs (" + ", ".join(steps) + ")"


def check_parity(resolved: ResolvedModel, onnx_dir: Path, dtype: str, num_tokens: int = 32) -> ParityReport:
    """Compare the export in `onnx_dir` with `resolved`'s model patched by its spec (see the module docstring)."""
    model_path, config, spec, onnx_dir = resolved.path, resolved.config, resolved.spec, Path(onnx_dir)
    runner = OrtCausalLM(onnx_dir)
    model = apply(load_model(model_path, dtype), spec)
    _no_early_stop(model)
    tolerance = TOLERANCES[dtype]
    prompts = _prompts(config)

    length, why_not = unscaled_length(spec, config)

    with torch.no_grad():
        cases = [_check_case(model, runner, name, prompts[name], num_tokens, tolerance) for name, _ in CASES]
        if length is not None:  # dynamic NTK: a prompt past the trained length, not the cases'
            rows = prompts[LONG_CASE] if length == CASE_LENGTH else _long_prompt(config, length)
            unscaled = _unscaled_difference(model, runner, spec, rows, tolerance)

    failures = [f"{case.name}: {failure}" for case in cases for failure in case.failures]
    note, difference = why_not or "", None
    if length is not None and not unscaled.reference > unscaled.bound:
        length, note = None, (f"at {unscaled.positions} positions the reference itself is within the tolerance of "
                              f"the unscaled model (max difference {unscaled.reference:.2e} <= {unscaled.bound:.2e})")
    if length is not None:
        difference = unscaled.export
        if length > CASE_LENGTH:  # no case reached these positions: the export is held to the reference there
            note = f"vs the reference there {unscaled.export_vs_reference:.2e}"
            if unscaled.export_vs_reference > unscaled.bound:
                failures.append(f"prefill {length}, batch 1: logits differ by {unscaled.export_vs_reference:.2e} "
                                f"> {unscaled.bound:.2e}")
        if not difference > unscaled.bound:
            failures.append(
                f"the export is indistinguishable from the unscaled model at {length} positions (max difference "
                f"{difference:.2e} <= {unscaled.bound:.2e}) although the reference differs from it there by "
                f"{unscaled.reference:.2e}: were the scales lost?"
            )
    return ParityReport(
        passed=not failures,
        provider=runner.provider,
        dtype=dtype,
        model_path=model_path.name,  # names, not paths: the report is published in the folder
        onnx_dir=f"{onnx_dir.name}/",
        num_tokens=num_tokens,
        tolerance=asdict(tolerance),
        scales=list(spec.scales),
        cases=cases,
        max_abs_error=max(case.max_abs_error for case in cases),
        max_rel_error=max(case.max_rel_error for case in cases),
        unscaled_difference=difference,
        failures=failures,
        unscaled_positions=length,
        unscaled_note=note,
    )


def unscaled_length(spec: Spec, config) -> tuple[int | None, str | None]:
    """The prompt length at which `spec` differs from the unscaled model, or (None, why the check does not apply).

    Linear and YaRN scales: the cases' longest prompt, unless every scale is 1 (then they are the model's own
    RoPE). Dynamic NTK at any factor is the model's own RoPE up to max_position_embeddings (transformers' dynamic
    keeps the base until a sequence passes it): twice that, if affordable (MAX_UNSCALED_POSITIONS).
    """
    if not spec.rope.length_dependent:
        if all(s == 1.0 for s in spec.scales):
            what = "YaRN at factor 1" if spec.rope.rope_type == "yarn" else "a scale of 1.0"
            return None, f"every layer has {what}, which is the unscaled model's own RoPE"
        return CASE_LENGTH, None
    trained = getattr(config, "max_position_embeddings", None)
    if not isinstance(trained, int) or isinstance(trained, bool) or trained < 1:
        return None, (f"{spec.rope.name} is the unscaled model up to the trained length, and the config states none "
                      "(max_position_embeddings)")
    length = max(CASE_LENGTH, 2 * trained)
    if length > MAX_UNSCALED_POSITIONS:
        return None, (f"{spec.rope.name} is the unscaled model up to {trained:,} positions (max_position_embeddings), "
                      f"and a {length:,}-position prompt that tells them apart is past the "
                      f"{MAX_UNSCALED_POSITIONS:,} this check prefills")
    return length, None


def _long_prompt(config, length: int) -> list[list[int]]:
    """One random prompt of `length` tokens (fixed seed), avoiding the special tokens, as `_prompts`."""
    vocab = _vocabulary(config)
    return [np.random.default_rng(1).choice(vocab, length).tolist()]


def _no_early_stop(model) -> None:
    # Both sides generate exactly num_tokens: the runner is called without an end token,
    # and transformers' generate must not stop at the model's own.
    model.generation_config.eos_token_id = None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = 0


def _prompts(config) -> dict[str, list[list[int]]]:
    """Random token ids (fixed seed), avoiding the special tokens the config names."""
    rng = np.random.default_rng(0)
    vocab = _vocabulary(config)
    return {name: [rng.choice(vocab, n).tolist() for n in lengths] for name, lengths in CASES}


def _vocabulary(config) -> np.ndarray:
    special: set = set()
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        special.update(value if isinstance(value, list) else [value])
    return np.array([i for i in range(min(config.vocab_size, 32000)) if i not in special])


def _check_case(model, runner: OrtCausalLM, name: str, rows: list[list[int]], num_tokens: int, tol: Tolerance):
    result = CaseResult(name, [len(r) for r in rows])
    ids, mask, positions = left_pad(rows)
    reference = _reference_logits(model, ids, mask, positions)
    onnx = runner.step(ids, mask, positions, runner.empty_past(len(rows)))[0]
    real = mask.astype(bool)  # padded positions have no meaning; compare real tokens only
    result.bound = tol.bound(reference[real])
    _compare(result, reference[real], onnx[real])

    ref_tokens, ref_steps = _reference_greedy(model, ids, mask, num_tokens)
    onnx_tokens, onnx_steps = runner.greedy_with_logits(rows, num_tokens)
    _compare_generation(result, ref_tokens, ref_steps, onnx_tokens, onnx_steps)
    result.failures = _case_failures(result) + result.failures
    return result


def _reference_logits(model, ids, mask, positions) -> np.ndarray:
    out = model(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(mask),
        position_ids=torch.from_numpy(positions),
    )
    return out.logits.float().numpy()


def _reference_greedy(model, ids, mask, num_tokens: int) -> tuple[list[list[int]], list[np.ndarray]]:
    out = model.generate(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(mask),
        max_new_tokens=num_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[:, ids.shape[1]:].tolist()
    return tokens, [step.float().numpy() for step in out.logits]


def _compare(result: CaseResult, reference: np.ndarray, onnx: np.ndarray) -> None:
    """Accumulate into `result` the comparison of logits [n, vocab], row by row."""
    error = float(np.abs(onnx - reference).max())
    result.max_abs_error = max(result.max_abs_error, error)
    result.max_rel_error = max(result.max_rel_error, error / (float(np.abs(reference).max()) or 1.0))
    ref_top, onnx_top = reference.argmax(-1), onnx.argmax(-1)
    margins = reference[np.arange(len(ref_top)), ref_top] - reference[np.arange(len(ref_top)), onnx_top]
    result.top1_compared += len(ref_top)
    result.top1_matches += int((ref_top == onnx_top).sum())
    result.top1_sure_mismatches += int((margins > result.bound).sum())


def _case_failures(result: CaseResult) -> list[str]:
    failures = []
    if result.max_abs_error > result.bound:
        failures.append(f"logits differ by {result.max_abs_error:.2e} > {result.bound:.2e}")
    if result.top1_sure_mismatches:
        count = result.top1_sure_mismatches
        failures.append(f"top-1 differs at {count} position(s) where the reference is not near a tie")
    return failures


def _compare_generation(result: CaseResult, ref_tokens, ref_steps, onnx_tokens, onnx_steps) -> None:
    """Tokens must match; at the first difference of a row the reference must have been at a near-tie."""
    for row, (ref, got) in enumerate(zip(ref_tokens, onnx_tokens)):
        first = next((t for t, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if first is None and len(ref) != len(got):
            first = min(len(ref), len(got))
        result.first_divergence.append(first)
        # Logits of steps whose inputs were still identical (the divergent step included).
        last = len(ref) - 1 if first is None else first
        for step in range(min(last + 1, len(onnx_steps), len(ref_steps))):
            _compare(result, ref_steps[step][row:row + 1], onnx_steps[step][row:row + 1])
        if first is not None:
            result.tokens_identical = False
            if first < len(ref) and first < len(got):
                margin = ref_steps[first][row, ref[first]] - ref_steps[first][row, got[first]]
                if margin <= result.bound:
                    continue  # a near-tie that precision cannot decide
            result.failures.append(f"greedy tokens of row {row} differ from step {first}")


@dataclass(frozen=True)
class _Unscaled:
    """The export, the reference and the unscaled model on one prompt of `positions` tokens."""

    positions: int
    export: float  # max |onnx - unscaled| logits
    reference: float  # max |reference - unscaled|: what the spec changes there
    export_vs_reference: float
    bound: float  # the tolerance on the reference's logits there


def _unscaled_difference(model, runner: OrtCausalLM, spec: Spec, rows: list[list[int]], tol: Tolerance) -> _Unscaled:
    """The export and the reference (`model`, patched with `spec`) against the unscaled model, on `rows`."""
    ids, mask, positions = left_pad(rows)
    onnx = runner.step(ids, mask, positions, runner.empty_past(len(rows)))[0]
    reference = _reference_logits(model, ids, mask, positions)
    apply(model, Spec.from_scales([1.0] * len(spec.scales)))  # all ones removes the patch
    unscaled = _reference_logits(model, ids, mask, positions)
    return _Unscaled(ids.shape[1], float(np.abs(onnx - unscaled).max()), float(np.abs(reference - unscaled).max()),
                     float(np.abs(onnx - reference).max()), tol.bound(reference))
