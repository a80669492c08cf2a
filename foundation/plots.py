"""PNG plots of the curve and the search (matplotlib, headless), each written atomically, and the helpers
every stage's plots share (validation draws its accuracy plot with them: validation/accuracy_plot.py).

Each plot is meant to be read without the paper: a title that says what was measured and
on what, axes with units, the legend outside the data, and lines that stay visible where
they coincide (distinct markers, small sideways offsets).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lpes.foundation.decision import LENGTH_MARGIN, Lengths
from lpes.foundation.files import save_atomic
from lpes.foundation.spec import Spec, StockRope

_MAX_LABELLED_TICKS = 16  # beyond this many layers, label every k-th (a round step) so the numbers stay legible
_TICK_STEPS = (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 250, 256, 500, 512, 1000, 1024)


def pyplot():
    """matplotlib's pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Write `fig` to `path` atomically, legends included, and close it."""
    # bbox_inches="tight" keeps the legends placed outside the axes inside the image.
    save_atomic(path, lambda tmp: fig.savefig(tmp, bbox_inches="tight"))
    pyplot().close(fig)
    return Path(path)


def legend_below(ax, columns: int = 2) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=columns, frameon=False, fontsize="small")


# ---- the curve ----


def layer_positions(spec: Spec) -> list[float]:
    """Where each layer sits on the curve's x axis: x_h = P0.x + (Pd.x - P0.x) h / (L - 1)."""
    from lpes.foundation.bezier import layer_positions as curve_positions

    if spec.curve is None:
        return [float(h) for h in range(len(spec.scales))]
    return curve_positions(spec.curve.control_points, len(spec.scales))


def plot_curve(spec: Spec, path: Path, title: str = "LPES: the RoPE scale of each decoder layer") -> Path:
    """Scale per layer, the Bezier control points (each labelled), s = 1 and the best uniform scale."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    xs = layer_positions(spec)
    ax.axhline(1.0, color="black", linewidth=0.8, label="s = 1: the model's own RoPE")
    uniform = spec.best_uniform_scale
    if uniform is not None:  # a wide pale band: still visible where the curve runs along it
        ax.axhline(uniform, color="C1", linewidth=6, alpha=0.3,
                   label=f"best uniform scale s = {uniform:g} (one scale for every layer)")
    if spec.curve is not None:
        _draw_control_points(ax, spec.curve.control_points)
        import numpy as np

        from lpes.foundation.bezier import bernstein

        curve = bernstein(np.asarray(spec.curve.control_points), np.linspace(0.0, 1.0, 200))
        ax.plot(curve[:, 0], curve[:, 1], "-", color="C0", linewidth=1.2, alpha=0.7, label="Bezier curve B(t)")
    # Markers alone when a curve is drawn: the scales are read off it at the layers, nothing lies between.
    ax.plot(xs, spec.scales, "o" if spec.curve is not None else "o-", color="C0",
            markersize=8 if len(xs) <= _MAX_LABELLED_TICKS else 4, zorder=3,
            label="s_h: scale of layer h (its positions act as i / s_h)")
    _layer_ticks(ax, xs)
    ax.margins(x=0.12)  # room for the control points' labels at both ends
    ax.set_xlabel("decoder layer h (0 = first, nearest the embeddings)")
    ax.set_ylabel("RoPE scale s_h (factor; 1 = unscaled)")
    top = max([*spec.scales, 1.0, uniform or 1.0, *(y for _, y in (spec.curve.control_points if spec.curve else []))])
    ax.set_ylim(0, top * 1.15)
    model = spec.base_model
    subtitle = f"{model}, {len(spec.scales)} layers" if model else f"{len(spec.scales)} layers"
    if spec.curve is not None:
        subtitle += f"; Bezier curve of degree {spec.curve.degree}"
    ax.set_title(f"{title}\n{subtitle}", fontsize="medium")
    ax.grid(alpha=0.3)
    legend_below(ax, columns=1)
    return save_figure(fig, path)


def _layer_ticks(ax, xs: Sequence[float]) -> None:
    step = next((k for k in _TICK_STEPS if len(xs) <= k * _MAX_LABELLED_TICKS), _TICK_STEPS[-1])
    ticks = list(range(0, len(xs), step))
    ax.set_xticks([xs[h] for h in ticks], [str(h) for h in ticks])


def _draw_control_points(ax, points: Sequence[Sequence[float]]) -> None:
    """The control polygon, with P_k labels; points at one x get their labels stacked, not overlaid."""
    xs, ys = zip(*points)
    # Hollow and larger than the layer markers, so a control point on the curve stays visible.
    ax.plot(xs, ys, "s--", color="gray", markerfacecolor="none", markersize=11, markeredgewidth=1.2, zorder=4,
            label="Bezier control points P_k (the curve bends towards them)")
    stacked: dict[float, int] = {}
    for k, (x, y) in enumerate(points):
        row = stacked.get(round(x, 9), 0)
        stacked[round(x, 9)] = row + 1
        ax.annotate(f"P{k} ({x:g}, {y:g})", (x, y), xytext=(8, 6 + 11 * row), textcoords="offset points",
                    fontsize="x-small", color="dimgray", zorder=5,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
                    arrowprops={"arrowstyle": "-", "color": "lightgray"} if row else None)


# ---- the search ----


def plot_fitness(history: list[dict], path: Path, *, uniform: dict | None = None, examples: int | None = None,
                 model: str | None = None, stock: Sequence[dict] = (), objective: str = "accuracy") -> Path:
    """Calibration accuracy per generation (parents' best, fully scored children's mean), and the work done.

    `uniform` is the search's uniform scan ({"scale", "fitness"}), drawn as the baseline the
    search starts from; `stock` the stock RoPE baselines ({"rope_type", "factor", "fitness"}),
    each drawn at its best factor; `examples` the calibration set's size, for the title.
    """
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.6), dpi=100, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    generations = [h["generation"] for h in history]
    if uniform is not None:
        # A wide pale band: still visible where the best parent sits exactly on it.
        top.axhline(uniform["fitness"], color="C1", linewidth=6, alpha=0.3,
                    label=f"best uniform scale s = {uniform['scale']:g} (generation 0 starts from it)")
    for k, baseline in enumerate(stock):
        name = StockRope(baseline["rope_type"], baseline["factor"]).name
        top.axhline(baseline["fitness"], color=f"C{8 + k % 2}", linestyle=(0, (5, 2 + 2 * k)), linewidth=1.5,
                    label=f"{name} (stock RoPE, its best factor)")
    top.plot(generations, [h["best"] for h in history], "o-", color="C0", zorder=3,
             label="best parent (the curve kept so far)")
    means = [(h["generation"], h["mean_scored"]) for h in history if h["mean_scored"] is not None]
    if means:
        top.plot(*zip(*means), "s--", color="C2", alpha=0.8, label="mean of the children scored in full")
    if objective == "accuracy":
        top.set_ylabel("calibration accuracy\n(fitness, share correct)")
        top.set_ylim(-0.03, 1.08)
    else:  # lpes-search --objective logprob: no fixed range
        top.set_ylabel("calibration objective\n(mean gold log-likelihood)")
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
    _plot_work(bottom, history)
    on = f" on {model}" if model else ""
    size = f"{examples} calibration examples, " if examples else ""
    top.set_title(f"lpes-search{on}: calibration {'accuracy' if objective == 'accuracy' else 'objective'} "
                  "by generation\n"
                  f"({size}{len(history) - 1} generations after generation 0)", fontsize="medium")
    return save_figure(fig, path)


def _plot_work(ax, history: list[dict]) -> None:
    """Candidates per generation: scored in full, raced out early, skipped as duplicates (stacked bars)."""
    generations = [h["generation"] for h in history]
    scored = [h["scored"] for h in history]
    raced = _per_generation([h["raced_out"] for h in history])  # the history keeps running totals
    duplicates = _per_generation([h["duplicates_skipped"] for h in history])
    ax.bar(generations, scored, color="C0", label="scored on every example")
    ax.bar(generations, raced, bottom=scored, color="C1", alpha=0.7, label="raced out (could not become a parent)")
    ax.bar(generations, duplicates, bottom=[a + b for a, b in zip(scored, raced)], color="lightgray",
           label="skipped (scales already met)")
    ax.set_ylabel("candidates")
    ax.set_xlabel("generation (0 includes the uniform scan)")
    ax.set_xticks(generations)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")


def _per_generation(totals: Sequence[int]) -> list[int]:
    return [now - before for before, now in zip([0, *totals], totals)]


_MARKERS = "osD^vP*X"


def plot_lengths(lengths: Lengths, alpha: float, path: Path, shipped: str | None = None) -> Path:
    """Each candidate's next-token loss over the unscaled model's at every rung of the decision's ladder of lengths
    (foundation/decision.py Lengths), one line per candidate; a filled marker where it breaks."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.axhline(0.0, color="grey", linewidth=1, label="unscaled (shipped)" if shipped == "unscaled" else "unscaled")
    ax.axhline(LENGTH_MARGIN, color="grey", linewidth=1, linestyle=":", label=f"margin ({LENGTH_MARGIN:g} nats)")
    for number, (name, checks) in enumerate(lengths.checks):
        if not checks:
            continue
        marker = _MARKERS[number % len(_MARKERS)]
        label = f"{name} (shipped)" if name == shipped else name
        line, = ax.plot([r.length for r in checks], [r.excess for r in checks], marker=marker, fillstyle="none",
                        label=label)
        broken = [r for r in checks if r.breaks(alpha)]
        ax.plot([r.length for r in broken], [r.excess for r in broken], linestyle="none", marker=marker,
                color=line.get_color())
    ax.set_xscale("log", base=2)
    rungs = sorted({r.length for _, checks in lengths.checks for r in checks})
    ax.set_xticks(rungs, [f"{r:,}" for r in rungs], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("prompt length (tokens); filled: significantly worse than unscaled there")
    ax.set_ylabel("next-token loss over unscaled (nats/token)")
    checked = "" if lengths.checked >= lengths.serve else f", checked up to {lengths.checked:,}"
    ax.set_title(f"The decision across lengths: {lengths.search:,} (searched) to {lengths.serve:,} tokens{checked}",
                 fontsize="medium")
    legend_below(ax)
    return save_figure(fig, path)
