"""The plots say what they show: integer layer ticks, legends outside the data, LPES named, data in the title."""

from __future__ import annotations

from pathlib import Path

import pytest

from lpes.foundation import plots
from lpes.foundation.spec import Spec
from lpes.validation import scoring
from lpes.validation.accuracy_plot import plot_accuracy
from lpes.validation.examples import Example
from lpes.validation.results import REFERENCE, UNIFORM, UNSCALED, ValidationReport, VariantResult


@pytest.fixture
def drawn(monkeypatch):
    """The figure each plot function draws, kept open for inspection (the PNG is still written)."""
    figures = []
    real_save = plots.save_figure

    def keep(fig, path):
        fig.canvas.draw()  # lay out the legends before the file is written and the figure closed
        figures.append({"axes": fig.axes, "renderer": fig.canvas.get_renderer()})
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def legend_outside(ax, renderer) -> bool:
    legend, box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    return not legend.overlaps(box)


@pytest.mark.parametrize("layers", [4, 32, 80])
def test_curve_has_integer_layer_ticks_and_its_legend_outside(tmp_path, drawn, layers):
    spec = Spec.from_curve([[0, 3.75], [0, 1.0], [0, 1.5], [layers - 1, 1.25]], layers)
    path = plots.plot_curve(spec, tmp_path / "curve.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    ax = drawn[0]["axes"][0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "0" and all(label.isdigit() for label in labels) and len(labels) <= 16
    assert legend_outside(ax, drawn[0]["renderer"])
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["P0 (0, 3.75)", "P1 (0, 1)", "P2 (0, 1.5)", f"P3 ({layers - 1}, 1.25)"]
    # Control points stacked at one x get their labels apart, not on top of each other.
    offsets = [t.xyann for t in ax.texts[:3]]
    assert len(set(offsets)) == 3


def test_accuracy_plot_names_lpes_offsets_equal_lines_and_states_the_data(tmp_path, drawn):
    gold = [0, 0, 15, 15]
    examples = [Example("p", "a1", g, 16) for g in gold]
    same = (True, False, True, True)
    variants = [
        VariantResult(name, "ok", scoring.Scores(tuple(scoring.ExampleResult(i, g, "a1", ok)
                                                       for i, (g, ok) in enumerate(zip(gold, verdicts))), 0), note)
        for name, verdicts, note in [(UNSCALED, (False, False, True, True), ""), (f"{UNIFORM} s=3.75", same, ""),
                                     (REFERENCE, same, ""), ("onnx", same, "CPUExecutionProvider")]
    ]
    report = ValidationReport("lpes-tiny-kv", examples, variants, None, prompt_tokens=[1024] * 4)
    plot_accuracy(report, Path(tmp_path / "validation.png"))
    ax = drawn[0]["axes"][0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "LPES (PyTorch reference): 75.0% overall" in labels
    assert "LPES, ONNX in onnxruntime (CPUExecutionProvider): 75.0% overall" in labels
    assert not any(label.startswith("reference") for label in labels)
    # Three variants with identical results: three distinct x positions at each gold index.
    first_x = [line.get_xdata()[0] for line in ax.get_lines()]
    assert len(set(first_x)) == len(first_x)
    assert "4 examples (2 per gold index), 16 facts each, prompts of 1024 tokens" in ax.get_title()
    assert ax.get_ylabel().startswith("accuracy (%") and "gold index" in ax.get_xlabel()
    assert legend_outside(ax, drawn[0]["renderer"])


def test_fitness_plot_title_baseline_and_legends_outside(tmp_path, drawn):
    history = [
        {"generation": 0, "best": 1.0, "mean_scored": 0.9, "scored": 2, "raced_out": 14, "duplicates_skipped": 0},
        {"generation": 1, "best": 1.0, "mean_scored": 0.9, "scored": 1, "raced_out": 15, "duplicates_skipped": 0},
        {"generation": 2, "best": 1.0, "mean_scored": None, "scored": 0, "raced_out": 15, "duplicates_skipped": 20},
    ]
    plots.plot_fitness(history, tmp_path / "fitness.png", uniform={"scale": 3.75, "fitness": 1.0}, examples=10,
                       model="lpes-tiny-kv")
    top, bottom = drawn[0]["axes"]
    assert "lpes-tiny-kv" in top.get_title() and "10 calibration examples" in top.get_title()
    assert top.get_ylabel().startswith("calibration accuracy") and "Eq." not in top.get_ylabel()
    assert any("best uniform scale s = 3.75" in line.get_label() for line in top.get_lines())
    # The history keeps running totals; the bars show each generation's own count.
    raced = [patch.get_height() for patch in bottom.containers[1]]
    assert raced == [14, 1, 0]
    assert legend_outside(top, drawn[0]["renderer"]) and legend_outside(bottom, drawn[0]["renderer"])
