"""validation.png: key-value accuracy against gold index, one line per variant, the data set in the title."""

from __future__ import annotations

from pathlib import Path

from lpes.exporters.targets import registry
from lpes.foundation import plots
from lpes.validation.results import REFERENCE, UNIFORM, UNSCALED, ValidationReport, VariantResult

_MARKERS = "^v<>ph*"


def variant_label(variant: VariantResult, shipped: str | None = None) -> str:
    """A name a reader knows: what ran, and what it is: LPES, or what the folder holds (`shipped`, "YaRN f=1.75")."""
    what = shipped or "LPES"
    if variant.name == UNSCALED:
        return "unscaled model (PyTorch)"
    if variant.name == REFERENCE:
        return f"{what} (PyTorch reference)"
    if variant.name.startswith(UNIFORM):
        return f"best uniform scale, {variant.name[len(UNIFORM):].strip()} (PyTorch)"
    if variant.baseline:
        return f"{variant.name}, best on calibration (PyTorch)"
    target = registry().get(variant.name)
    label = target.label if target is not None and target.label else f"LPES, {variant.name} export"
    label = label.replace("LPES", what, 1)
    return f"{label} ({variant.note})" if variant.note else label  # how it ran: provider, custom code or not


def _variant_style(variant: VariantResult, n: int) -> dict:
    if variant.name == UNSCALED:
        return {"marker": "o", "linestyle": "--", "color": "gray"}
    if variant.name == REFERENCE:
        return {"marker": "s", "linestyle": "-", "color": "C0", "markersize": 8}
    if variant.name.startswith(UNIFORM):
        return {"marker": "D", "linestyle": "-.", "color": "C1"}
    if variant.baseline:  # the stock RoPE types: dash-dot like the uniform baseline, colours no export takes
        kind = variant.name.split(" f=")[0]
        return {"marker": "X" if kind == "YaRN" else "P", "linestyle": "-.", "color": "C8" if kind == "YaRN" else "C9"}
    # Exports: hollow markers, so one that sits on the reference leaves the reference visible.
    return {"marker": _MARKERS[n % len(_MARKERS)], "linestyle": ":", "color": f"C{2 + n}",
            "markerfacecolor": "none", "markeredgewidth": 1.5}


def plot_accuracy(report: ValidationReport, path: Path) -> Path:
    """Accuracy against gold index, one line per scored variant, with the data set in the title."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=100)
    gold = report.gold_indices
    scored = [v for v in report.variants if v.scores is not None]
    # Identical results would draw one line over another: shift each variant a little sideways.
    gap = min((b - a for a, b in zip(gold, gold[1:])), default=1)
    step = 0.5 * gap / max(len(scored), 1)
    exports = 0
    for i, v in enumerate(scored):
        by_index = v.scores.accuracy_by_gold_index()
        offset = (i - (len(scored) - 1) / 2) * step
        style = _variant_style(v, exports)
        exports += style["linestyle"] == ":"
        ax.plot([g + offset for g in by_index], [100 * a for a in by_index.values()],
                label=f"{variant_label(v, report.shipped)}: {100 * v.scores.accuracy:.1f}% overall", **style)
    ax.set_xticks(gold)
    pairs = report.examples[0].num_pairs if report.examples else None
    among = f" among the {pairs}" if pairs else ""
    ax.set_xlabel(f"gold index: position of the needed fact{among} (0 = first, farthest from the query)")
    ax.set_ylabel("accuracy (% answered correctly)")
    ax.set_ylim(-4, 108)
    ax.grid(alpha=0.3)
    ax.set_title(f"Key-value retrieval accuracy by position\n{_data_caption(report)}", fontsize="medium")
    plots.legend_below(ax, columns=1)
    return plots.save_figure(fig, path)


def _data_caption(report: ValidationReport) -> str:
    total, gold = len(report.examples), report.gold_indices
    caption = f"{report.model}: {total} examples ({total // max(len(gold), 1)} per gold index)"
    if report.examples:
        caption += f", {report.examples[0].num_pairs} facts each"
    if report.prompt_tokens:
        low, high = min(report.prompt_tokens), max(report.prompt_tokens)
        caption += f", prompts of {low} tokens" if low == high else f", prompts of {low}-{high} tokens"
    return caption + ", greedy decoding"
