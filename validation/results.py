"""What a validation found: one `VariantResult` per variant, the `ValidationReport` of them all, its verdict,
its JSON (validation.json) and its markdown table (validation.md, embedded in the model card)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpes.validation.examples import Example

if TYPE_CHECKING:  # types only: lpes-validate's checks of its folder read the file names below without torch
    from lpes.converter.model_card import Measured
    from lpes.foundation.decision import Decision
    from lpes.validation import checks, scoring

FORMAT = "lpes-validation"
VERSION = 1
JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "validation.json", "validation.md", "validation.png"
REFERENCE = "reference"
UNSCALED = "unscaled"
UNIFORM = "best uniform"
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
    same_as: str | None = None  # the variant it is identical to (scored once, its scores shown under both names)

    @property
    def passed(self) -> bool:
        return self.allowed is None or len(self.disagreements) <= self.allowed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "note": self.note, "baseline": self.baseline}
        if self.same_as is not None:
            out["same_as"] = self.same_as
        if self.scores is not None:
            out["accuracy"] = self.scores.accuracy
            out["accuracy_by_gold_index"] = {str(k): v for k, v in self.scores.accuracy_by_gold_index().items()}
            out["forward_tokens"] = 0 if self.same_as else self.scores.forward_tokens
        if self.allowed is not None:
            out.update(dtype=self.dtype, disagreements=self.disagreements, allowed=self.allowed, passed=self.passed)
        return out


PASSED, FAILED, NOT_VALIDATED = "passed", "failed", "not validated"


@dataclass
class ValidationReport:
    model: str  # as the user named it (a Hub id or a folder's name), never a path of this machine
    examples: list[Example]
    variants: list[VariantResult]
    max_new_tokens: int | None
    checks: list[checks.Check] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # per example, as scored (the plot's caption)
    task: str = ""  # what the examples are, in one line (the Task line of the table)
    setup_problem: str | None = None  # every variant scored 0: the task as set up measured nothing
    warnings: list[str] = field(default_factory=list)  # said in the report, no failure
    kept: str | None = None  # the earlier results this run did not overwrite, and where this run's went
    # Published text -> what the console shows instead (a path as the user typed it, absolute ones included).
    console_paths: dict[str, str] = field(default_factory=dict)
    searched_on: str | None = None  # the model and/or task the curve was searched on, when not the ones measured
    decision: Decision | None = None  # lpes-search's held-out decision (the spec's), shown beside this run's test
    # What the folder holds where it is not a per-layer curve ("YaRN f=1.75"): plots and tables name it so.
    shipped: str | None = None
    lengths_plot: str | None = None  # the folder's plot of the decision's ladder of lengths, where it has one

    @property
    def verdict(self) -> str:
        """"passed" only when every planned check ran and held; "not validated" when one did not run."""
        if self.setup_problem or not all(v.passed for v in self.variants) or not all(c.passed for c in self.checks):
            return FAILED
        if any(c.status == "skipped" for c in self.checks) or self.skipped_exports():
            return NOT_VALIDATED
        return PASSED

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    def skipped_exports(self) -> list[VariantResult]:
        """Exports in the folder that could not run here: written, but not checked."""
        return [v for v in self.variants if v.status == "skipped" and not v.baseline]

    def verdict_reason(self) -> str:
        """What failed, or what did not run; empty when passed."""
        if self.verdict == FAILED:
            return "; ".join(self.failures())
        if self.verdict == NOT_VALIDATED:
            missing = [f"{c.name} skipped" for c in self.checks if c.status == "skipped"]
            return "; ".join(missing + [f"{v.name} not run ({v.note})" for v in self.skipped_exports()])
        return ""

    def verdict_line(self) -> str:
        """The verdict in one line: what held, what failed, or what did not run."""
        if self.verdict == PASSED:
            worse = self.significantly_worse()
            return "**passed**" if worse is None else (
                f"**what ships answers significantly below the unscaled model on these prompts** ({worse}); "
                "**passed** as a conversion: every export answers as the reference")
        if self.verdict == FAILED:
            return "**FAILED**: " + self.verdict_reason()
        return (f"**not validated**: {self.verdict_reason()} (every check that ran held; what did not run was not "
                "measured)")

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

    def significantly_worse(self) -> str | None:
        """What ships (the reference) against the unscaled model on these prompts, where McNemar's exact test
        finds it worse at the decision's alpha: "0.0% vs 21.5% unscaled, 0/43 prompts, p = 2e-13"."""
        from lpes.foundation.decision import DEFAULT_ALPHA, mcnemar

        names = {v.name for v in self.variants if v.scores is not None}
        if not {UNSCALED, REFERENCE} <= names:
            return None
        this, base = (tuple(r.correct for r in self.variant(n).scores.results) for n in (REFERENCE, UNSCALED))
        only_this, only_base, p = mcnemar(this, base)
        if only_base <= only_this or p >= (self.decision.alpha if self.decision else DEFAULT_ALPHA):
            return None
        return (f"{100 * sum(this) / len(this):.1f}% vs {100 * sum(base) / len(base):.1f}% unscaled, "
                f"{only_this}/{only_base} prompts right only with it / only unscaled, p = {p:.2g}")

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
        return ([self.setup_problem] if self.setup_problem else []) + [
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
            "verdict": self.verdict,
            "passed": self.passed,
            "num_examples": len(self.examples),
            "gold_indices": self.gold_indices,
            "max_new_tokens": self.max_new_tokens,
            "task": self.task,
            "searched_on": self.searched_on,
            "checks": [c.to_json() for c in self.checks],
            "setup_problem": self.setup_problem,
            "warnings": self.warnings,
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
        if self.task:
            lines += [f"Task: {self.task}.", ""]
        if self.searched_on:
            lines += [f"Searched on: {self.searched_on}. The curve and the baselines' settings were found by "
                      "lpes-search there, not on what this table measures.", ""]
        if self.variants:
            lines += self._table()
        lines += self._decision_lines()
        if self.harm():
            lines += [f"**Warning**: {self.harm()}.", ""]
        if self.beaten():
            lines += [f"**Note**: {self.beaten()}.", ""]
        lines += [f"**Warning**: {w}." for w in self.warnings] + ([""] if self.warnings else [])
        lines.append(self.verdict_line())
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
            lines.append(_markdown_row(v, gold, len(self.examples), self.shipped))
        return lines + ["", f"![accuracy by gold index]({PLOT_FILE})", ""]

    def _decision_lines(self) -> list[str]:
        """The decision's test (foundation/decision.py) on these prompts, beside lpes-search's own on its held-out
        ones: the PyTorch variants, each held against the simpler ones, all and middle."""
        from lpes.foundation.decision import (
            DEFAULT_ALPHA,
            Candidate,
            decide,
            format_table,
            in_middle,
            ladder_table,
            markdown_text,
        )

        scored = [v for v in self.variants if v.scores is not None and v.allowed is None and not v.same_as]
        if not scored or scored[0].name != UNSCALED or self.setup_problem:
            return []

        def kind(v: VariantResult) -> str:
            if v.name == UNSCALED:
                return "unscaled"
            return ("uniform" if v.name.startswith(UNIFORM) else "stock") if v.baseline else "per-layer"

        names = {REFERENCE: f"{self.shipped or 'LPES'} reference"}
        candidates = [Candidate(names.get(v.name, v.name), kind(v), tuple(r.correct for r in v.scores.results))
                      for v in scored]
        middle = [in_middle(e.gold_index, e.num_pairs) for e in self.examples]
        alpha = self.decision.alpha if self.decision else DEFAULT_ALPHA
        # Marked "decided here", not "shipped": what this folder ships is the spec's, whatever these prompts say.
        here = decide(candidates, middle, alpha)
        lines = ["The decision's test on these prompts (the PyTorch variants; exports answer as the reference):",
                 ""] + format_table(here, "On these prompts", shipped="") + [""]
        if self.decision:
            lines += [f"lpes-search's decision on its {self.decision.prompts} held-out prompts: "
                      f"{markdown_text(self.decision.reason)}.", ""]
            if self.decision.lengths is not None:  # and how each option held on longer prompts
                lines += ladder_table(self.decision.lengths, self.decision.alpha) + [""]
                if self.lengths_plot:
                    lines += [f"![the decision across lengths]({self.lengths_plot})", ""]
        return lines

    def measured(self) -> Measured | None:
        """The numbers the model card states; None when key-value scoring did not run (or measured nothing)."""
        from lpes.converter.model_card import Accuracy, Measured

        scored = {v.name: v for v in self.variants if v.scores is not None}
        if UNSCALED not in scored or REFERENCE not in scored or self.setup_problem:
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
        """What the CLI prints: the table, the verdict, and which results were kept."""
        text = self.markdown().replace(f"\n![accuracy by gold index]({PLOT_FILE})\n", "")
        if self.lengths_plot:
            text = text.replace(f"![the decision across lengths]({self.lengths_plot})\n", "")
        if self.kept:
            text += self.kept + "\n"
        for published, console in self.console_paths.items():
            text = text.replace(published, console)
        return text


def _right(v: VariantResult) -> int:
    return sum(r.correct for r in v.scores.results)


def _markdown_row(v: VariantResult, gold: list[int], total: int, shipped: str | None = None) -> str:
    label = {UNSCALED: "unscaled (PyTorch)", REFERENCE: f"{shipped or 'LPES'} reference (PyTorch)"}.get(v.name, v.name)
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
