"""PNG plots shared by the stages (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from lpes.spec import Spec


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curve(spec: Spec, path: Path, title: str = "LPES scales by layer") -> Path:
    """Scale per layer, with the Bezier control points when the spec has a curve."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    layers = list(range(len(spec.scales)))
    ax.plot(layers, spec.scales, "o-", label="s_h (per layer)")
    if spec.curve is not None:
        xs, ys = zip(*spec.curve.control_points)
        ax.plot(xs, ys, "s--", color="gray", alpha=0.6, label="control points")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("RoPE scale s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_fitness(history: list[dict], path: Path) -> Path:
    """Best and mean calibration fitness per generation of a search."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    generations = [h["generation"] for h in history]
    ax.plot(generations, [h["best"] for h in history], "o-", label="best (parents)")
    means = [(h["generation"], h["mean_scored"]) for h in history if h["mean_scored"] is not None]
    if means:
        ax.plot(*zip(*means), "s--", alpha=0.7, label="mean of fully scored children")
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness (Eq. 7)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
