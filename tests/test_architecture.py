"""The stages import one way, and a target is one file (docs/architecture.md).

    foundation (lpes/: spec, files, errors, ...) <- converter/ <- exporters/ <- validation/ <- search/ <- top

Every `import` and `from ... import` of every module is read from its source (the ones inside
functions too), so a lazy import against the direction fails here as a top-level one does.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from lpes.exporters import targets

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
# The folders of the installed packages (pyproject.toml's package-dir), bottom to top.
PACKAGES = {"lpes": "lpes", "converter": "lpes.converter", "exporters": "lpes.exporters",
            "validation": "lpes.validation", "search": "lpes.search"}
# lpes/ holds both ends: the foundation every stage may use, and the top that may use every stage.
FOUNDATION = {f"lpes.{name}" for name in
              ("bezier", "devices", "errors", "files", "interrupts", "outputs", "plots", "spec", "version")}
TOP = {"lpes", "lpes.cli", "lpes.convert_pipeline", "lpes.generate", "lpes.search_cli"}
LEVELS = {"lpes.converter": 1, "lpes.exporters": 2, "lpes.validation": 3, "lpes.search": 4}
TOP_LEVEL = 5
# What validation and search may import of the exporters: the Target interface and the runner it returns.
TARGET_INTERFACE = {"lpes.exporters", "lpes.exporters.targets", "lpes.exporters.runners"}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def level(module: str) -> int:
    if module in TOP:
        return TOP_LEVEL
    if module in FOUNDATION:
        return 0
    for package, rank in LEVELS.items():
        if module == package or module.startswith(package + "."):
            return rank
    raise AssertionError(f"{module} is in no stage: add it to FOUNDATION or TOP here, and to docs/architecture.md")


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported lpes module) for every import in `path`, top-level or not."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "lpes"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != "lpes":
                continue
            for alias in node.names:  # `from lpes.foundation import plots` imports the module lpes.foundation.plots
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if name in MODULES else base))
    return found


def test_every_module_of_lpes_is_in_a_stage():
    assert {m for m in MODULES if m.count(".") == 1 and m.startswith("lpes.") and m.split(".")[1] not in
            ("converter", "exporters", "validation", "search")} <= FOUNDATION | TOP
    for module in MODULES:
        level(module)


def test_no_module_imports_against_the_direction_lazy_imports_included():
    against = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
               for module, path in MODULES.items() for line, imported in imports(module, path)
               if level(imported) > level(module)]
    assert against == []


def test_validation_and_search_reach_the_exports_through_the_target_interface_only():
    reached = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
               for module, path in MODULES.items()
               if level(module) in (LEVELS["lpes.validation"], LEVELS["lpes.search"])
               for line, imported in imports(module, path)
               if level(imported) == LEVELS["lpes.exporters"] and imported not in TARGET_INTERFACE]
    assert reached == []


def test_no_target_file_imports_another():
    crossed = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
               for module, path in MODULES.items() if module.startswith("lpes.exporters.target_")
               for line, imported in imports(module, path)
               if imported.startswith("lpes.exporters.target_") and imported != module]
    assert crossed == []


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of `path` that is not a docstring (f-strings' literal parts included)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_code_outside_a_targets_own_files_names_a_target():
    """A target's name and folder ("onnx", "onnx/model.onnx", "OUT/onnx") live in its class: the pipeline,
    validation, the plots and the CLI read them from the registry. Shared exporter modules count as outside."""
    names = list(targets.registry())
    alternatives = "|".join(map(re.escape, names))
    as_path = re.compile(r"(?<![\w.-])(" + alternatives + r")/|\b(OUT|DIR)/(" + alternatives + r")\b")
    shared = {"lpes.exporters", "lpes.exporters.targets", "lpes.exporters.runners", "lpes.exporters.received"}
    named = [f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
             for module, path in MODULES.items()
             if not module.startswith("lpes.exporters.") or module in shared
             for line, text in _strings(path) if text in names or as_path.search(text)]
    assert named == []


# ---- a made-up target, in a module of its own ----

MADE_UP = '''
"""A made-up target: the scales in a JSON file, run by re-applying them to the base model."""

import json
from pathlib import Path

from lpes.exporters.targets import OpenedExport, Target, Written, register


@register
class ScalesFile(Target):
    name, folder, marker = "scalesfile", "scales", "scales.json"
    help = "the per-layer scales as JSON"
    label = "LPES, scales re-applied"
    finished = []

    def write(self, folder: Path) -> Written:
        (folder / self.marker).write_text(json.dumps({"scales": list(self.job.spec.scales),
                                                      "model": str(self.job.model_path)}))
        return Written(reports=["scalesfile: wrote scales.json"])

    def finish(self, folder, validation):
        ScalesFile.finished.append(None if validation is None else validation.verdict)

    @classmethod
    def open(cls, folder, run):
        from lpes.converter.loading import load_model
        from lpes.converter.reference import apply
        from lpes.exporters.runners import TorchGreedy
        from lpes.foundation.spec import Spec

        written = json.loads((Path(folder) / cls.marker).read_text())
        model = apply(load_model(Path(written["model"])), Spec.from_scales(written["scales"]))
        return OpenedExport(TorchGreedy(model, run.pad_token_id), "re-applied", "float32")
'''


@pytest.fixture
def made_up_target(tmp_path, monkeypatch):
    """The module above, written to a file and imported: registering is all it does to lpes."""
    monkeypatch.setattr(targets, "_REGISTRY", dict(targets.registry()))
    path = tmp_path / "lpes_scales_target.py"
    path.write_text(textwrap.dedent(MADE_UP))
    spec = importlib.util.spec_from_file_location("lpes_scales_target", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ScalesFile


def test_a_made_up_target_is_converted_validated_plotted_and_reported(made_up_target, tmp_path, monkeypatch,
                                                                      capsys):
    from lpes.cli import build_parser, convert_main
    from lpes.foundation import plots
    from lpes.foundation.spec import Spec, dump_spec

    drawn = []
    real_save = plots.save_figure

    def keep(fig, path):
        drawn.append([line.get_label() for ax in fig.axes for line in ax.get_lines()])
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    assert "  OUT/scales/    scalesfile: the per-layer scales as JSON" in build_parser("lpes-convert").format_help()
    assert "DIR/scales" in build_parser("lpes-validate").format_help()
    spec = tmp_path / "spec.json"
    dump_spec(Spec.from_scales([2.0, 1.5, 1.0, 1.0]), spec)
    out = tmp_path / "out"
    argv = ["lpes-tiny-kv", "--curve", str(spec), "--to", "scalesfile", "--out", str(out),
            "--data", "tiny-kv:examples=2"]
    assert convert_main(argv) == 0
    assert json.loads((out / "scales" / "scales.json").read_text())["scales"] == [2.0, 1.5, 1.0, 1.0]
    validation = json.loads((out / "validation.json").read_text())
    made_up = next(v for v in validation["variants"] if v["name"] == "scalesfile")
    assert made_up["status"] == "ok" and made_up["passed"] is True and made_up["note"] == "re-applied"
    assert "| scalesfile (re-applied) |" in (out / "validation.md").read_text()
    assert (out / "validation.png").read_bytes()[:4] == b"\x89PNG"
    assert any(label.startswith("LPES, scales re-applied (re-applied): ") for label in drawn[-1])
    assert made_up_target.finished == ["passed"]
    printed = capsys.readouterr().out
    assert "scalesfile: wrote scales.json" in printed and "| scalesfile (re-applied) |" in printed
