"""The export-target registry: a new target is one registered class, and lpes-convert plans, writes and validates it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lpes.cli import convert_main
from lpes.exporters import targets
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec, dump_spec

torch.set_num_threads(1)


class ScalesOnly(targets.Target):
    """A made-up target: the scales in a JSON file, run by re-applying them to the base model."""

    name, folder, marker = "dummy", "dummy", "scales.json"
    checked: list[str] = []

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--dummy-refuse", action="store_true")

    @classmethod
    def options_from(cls, args):
        return {"refuse": args.dummy_refuse}

    def check(self) -> None:
        ScalesOnly.checked.append(self.job.model_name)
        if self.options["refuse"]:
            raise LpesError("dummy: refused at plan time")

    def write(self, folder: Path) -> targets.Written:
        (folder / self.marker).write_text(json.dumps({"scales": list(self.job.spec.scales),
                                                      "model": str(self.job.model_path)}))
        return targets.Written(reports=["dummy: wrote scales.json"])

    @classmethod
    def open(cls, folder: Path, run: targets.RunContext) -> targets.OpenedExport:
        from lpes.converter.loading import load_model
        from lpes.converter.reference import apply
        from lpes.exporters.runners import TorchGreedy

        written = json.loads((folder / cls.marker).read_text())
        model = apply(load_model(Path(written["model"])), Spec.from_scales(written["scales"]))
        return targets.OpenedExport(TorchGreedy(model, run.pad_token_id), "re-applied", "float32")


@pytest.fixture
def dummy_registered(monkeypatch):
    targets.registry()
    monkeypatch.setitem(targets._REGISTRY, "dummy", ScalesOnly)
    ScalesOnly.checked.clear()


def test_a_registered_target_is_planned_written_and_validated(dummy_registered, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    dump_spec(Spec.from_scales([2.0, 1.5, 1.0, 1.0]), spec)
    out = tmp_path / "out"
    argv = ["lpes-tiny-kv", "--curve", str(spec), "--to", "dummy", "--out", str(out), "--data", "tiny-kv:examples=2"]
    assert convert_main(argv) == 0
    assert ScalesOnly.checked == ["lpes-tiny-kv"]
    assert json.loads((out / "dummy" / "scales.json").read_text())["scales"] == [2.0, 1.5, 1.0, 1.0]
    validation = json.loads((out / "validation.json").read_text())
    names = [v["name"] for v in validation["variants"]]
    assert names == ["unscaled", "reference", "dummy"]
    dummy = validation["variants"][-1]
    assert dummy["status"] == "ok" and dummy["disagreements"] == [] and dummy["passed"] is True
    assert "dummy: wrote scales.json" in capsys.readouterr().out


def test_a_target_refuses_at_plan_time_before_anything_is_written(dummy_registered, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    dump_spec(Spec.from_scales([2.0, 1.5, 1.0, 1.0]), spec)
    argv = ["lpes-tiny-kv", "--curve", str(spec), "--to", "hf,dummy", "--out", str(tmp_path / "out"),
            "--dummy-refuse"]
    assert convert_main(argv) == 2
    assert "dummy: refused at plan time" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]


def test_targets_come_in_pipeline_order_with_what_they_need():
    assert [t.name for t in targets.parse_targets("genai,tensorrt,hf")] == ["hf", "onnx", "tensorrt", "genai"]
    with pytest.raises(LpesError, match="--to takes a comma-separated list of hf, onnx, tensorrt, genai; got onx"):
        targets.parse_targets("onx")
