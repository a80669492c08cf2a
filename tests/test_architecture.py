"""The layers import one way, a module's layer is its folder, and a target is one folder (docs/architecture.md).

    foundation/ <- converter/ <- exporters/ <- validation/ <- search/ <- lpes/ (the top: commands, pipeline, API)

Every `import` and `from ... import` of every module is read from its source (the ones inside
functions too), so a lazy import against the direction fails here as a top-level one does. A
module's layer is read off the folder it sits in and nothing else: a new file in a folder is in
that folder's layer, whatever it imports.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lpes.exporters
from lpes.exporters import targets

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
# The layers, bottom to top: one folder each, and the package pyproject.toml's package-dir maps it to.
LAYERS = {"foundation": "lpes.foundation", "converter": "lpes.converter", "exporters": "lpes.exporters",
          "validation": "lpes.validation", "search": "lpes.search", "lpes": "lpes"}
RANK = {folder: rank for rank, folder in enumerate(LAYERS)}
EXPORTERS, VALIDATION, SEARCH = RANK["exporters"], RANK["validation"], RANK["search"]
# What validation and search may import of the exporters: the Target interface and the runner it returns.
TARGET_INTERFACE = {"lpes.exporters", "lpes.exporters.targets", "lpes.exporters.runners"}


class Module:
    def __init__(self, name: str, path: Path, layer: str):
        self.name, self.path, self.layer = name, path, layer


def modules(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the layer folders under `root`, with the layer of the folder it sits in."""
    found = {}
    for folder, package in LAYERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(root / folder).with_suffix("").parts if p != "__init__"]
            name = ".".join([package, *parts])
            found[name] = Module(name, path, folder)
    return found


MODULES = modules()


def imports(module: Module, known: dict[str, Module]) -> list[tuple[int, str]]:
    """(line, imported lpes module) for every import in the module's file, top-level or not."""
    found = []
    for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "lpes"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module.name.split(".")
                package = package if module.path.name == "__init__.py" else package[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != "lpes":
                continue
            for alias in node.names:  # `from lpes.foundation import plots` imports the module lpes.foundation.plots
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if name in known else base))
    return found


def against_the_direction(root: Path = ROOT) -> list[str]:
    """`file:line imports module` for every import of a module in a higher layer, or in no layer folder."""
    known = modules(root)
    found = []
    for module in known.values():
        for line, imported in imports(module, known):
            where = f"{module.path.relative_to(root)}:{line}"
            if imported not in known:
                found.append(f"{where} imports {imported}, which is in no layer folder")
            elif RANK[known[imported].layer] > RANK[module.layer]:
                found.append(f"{where} imports {imported}")
    return found


def unpackaged_folders(root: Path = ROOT) -> list[str]:
    """Folders of the layers that hold Python files but are not a package pyproject.toml installs."""
    tomllib = pytest.importorskip("tomllib")
    packages = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {path.parent for folder in LAYERS for path in (root / folder).rglob("*.py")}
    named = {folder: ".".join([LAYERS[folder.relative_to(root).parts[0]], *folder.relative_to(root).parts[1:]])
             for folder in folders}
    return sorted(f"{folder.relative_to(root)} ({name})" for folder, name in named.items()
                  if name not in packages or not (folder / "__init__.py").is_file())


def test_pyproject_maps_each_layer_folder_to_its_package():
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {package: folder for folder, package in LAYERS.items()}
    assert unpackaged_folders() == []


def test_no_module_imports_against_the_direction_lazy_imports_included():
    assert against_the_direction() == []


def test_the_readme_pipeline_table_and_the_architecture_tree_list_the_layers_in_order():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## The pipeline"):readme.index("Each folder is one stage")]
    assert re.findall(r"^    (\w+)/ +([\w.]+) ", table, re.M) == list(LAYERS.items())
    doc = (ROOT / "docs" / "architecture.md").read_text()
    tree = doc[doc.index("## The tree"):doc.index("## Where a new piece goes")]
    assert re.findall(r"^    (\w+)/ +([\w.]+) ", tree, re.M) == list(LAYERS.items())
    named = re.findall(r"^      (exporters/)?(\w+)/ ", tree, re.M)
    assert {name for _, name in named} >= TARGET_FOLDERS


# ---- the checks above fail on what they are there to catch (a copy of the tree, with a plant) ----


@pytest.fixture
def tree_copy(tmp_path):
    """The layer folders' Python files and pyproject.toml, copied: a tree to plant in."""
    for folder in LAYERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=lambda d, names: [
            n for n in names if not n.endswith(".py") and not (Path(d) / n).is_dir() or n == "__pycache__"])
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert against_the_direction(tmp_path) == [] and unpackaged_folders(tmp_path) == []
    return tmp_path


def test_a_planted_import_that_points_the_wrong_way_fails(tree_copy):
    module = tree_copy / "converter" / "hub.py"
    lines = module.read_text().splitlines()
    planted = ["", "", "def planted():", "    from lpes.validation.scoring import score_examples"]
    module.write_text("\n".join(lines + planted))
    assert against_the_direction(tree_copy) == [f"converter/hub.py:{len(lines) + 4} imports lpes.validation.scoring"]


def test_a_planted_file_in_the_wrong_folder_fails(tree_copy):
    """Search's code put in the foundation's folder is the foundation's: its imports point the wrong way."""
    (tree_copy / "foundation" / "best_of.py").write_text("from lpes.search.genome import Genome\n")
    assert against_the_direction(tree_copy) == ["foundation/best_of.py:1 imports lpes.search.genome"]
    (tree_copy / "exporters" / "scalesfile").mkdir()
    (tree_copy / "exporters" / "scalesfile" / "target.py").write_text("import json\n")
    assert unpackaged_folders(tree_copy) == ["exporters/scalesfile (lpes.exporters.scalesfile)"]


def test_validation_and_search_reach_the_exports_through_the_target_interface_only():
    reached = [f"{module.path.relative_to(ROOT)}:{line} imports {imported}"
               for module in MODULES.values() if RANK[module.layer] in (VALIDATION, SEARCH)
               for line, imported in imports(module, MODULES)
               if MODULES[imported].layer == "exporters" and imported not in TARGET_INTERFACE]
    assert reached == []


def _target_folder(module: str) -> str | None:
    """`onnx` for lpes.exporters.onnx.runner; None for what the exporters share (targets, runners, received)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["lpes", "exporters"] and parts[2] in TARGET_FOLDERS else None


TARGET_FOLDERS = {path.parent.name for path in (ROOT / "exporters").glob("*/target.py")}


def test_each_target_is_a_folder_named_after_it_holding_its_class():
    builtin = {name: cls for name, cls in targets.registry().items() if cls.__module__.startswith("lpes.exporters.")}
    assert {name: cls.__module__ for name, cls in builtin.items()} == {
        name: f"lpes.exporters.{name}.target" for name in TARGET_FOLDERS}


def test_a_target_folder_imports_another_only_when_built_from_it_and_shared_code_none():
    known = targets.registry()
    crossed = [f"{module.path.relative_to(ROOT)}:{line} imports {imported}"
               for module in MODULES.values() if module.layer == "exporters"
               for line, imported in imports(module, MODULES)
               if _target_folder(imported) not in (None, _target_folder(module.name))
               and (_target_folder(module.name) is None
                    or _target_folder(imported) not in known[_target_folder(module.name)].needs)]
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
    validation, the plots and the CLI read them from the registry. What the exporters share counts as outside."""
    names = list(targets.registry())
    alternatives = "|".join(map(re.escape, names))
    as_path = re.compile(r"(?<![\w.-])(" + alternatives + r")/|\b(OUT|DIR)/(" + alternatives + r")\b")
    named = [f"{module.path.relative_to(ROOT)}:{line}: {text[:60]!r}"
             for module in MODULES.values() if _target_folder(module.name) is None
             for line, text in _strings(module.path) if text in names or as_path.search(text)]
    assert named == []


# ---- a made-up target, in a folder of its own ----

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
    """The module above as exporters/scalesfile/target.py, in a folder that lpes.exporters' search path gains:
    the registry finds it as it finds the built-in ones, and registering is all it does to lpes."""
    folder = tmp_path / "more_exporters" / "scalesfile"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text('"""A made-up target."""\n')
    (folder / "target.py").write_text(textwrap.dedent(MADE_UP))
    monkeypatch.setattr(lpes.exporters, "__path__", [*lpes.exporters.__path__, str(folder.parent)])
    monkeypatch.setattr(targets, "_REGISTRY", dict(targets.registry()))
    monkeypatch.setattr(targets, "_BUILTINS_LOADED", False)
    assert "scalesfile" not in targets._REGISTRY
    yield targets.registry()["scalesfile"]
    for name in ("lpes.exporters.scalesfile.target", "lpes.exporters.scalesfile"):
        sys.modules.pop(name, None)
    if hasattr(lpes.exporters, "scalesfile"):
        delattr(lpes.exporters, "scalesfile")


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


def test_every_lpes_import_resolves_lazy_ones_included():
    """Every `from lpes.X import Y` in the packages names a module and a name that exist, the imports inside
    functions too: a module moved to another folder leaves no import behind that fails only when its
    function first runs (after the layout change, --to genai's size estimate did, in make demo)."""
    import importlib.util

    missing = []
    for folder in ["foundation", "converter", "exporters", "validation", "search", "lpes"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lpes")):
                    continue
                module = importlib.import_module(node.module)
                for name in (alias.name for alias in node.names):
                    if not hasattr(module, name) and importlib.util.find_spec(f"{node.module}.{name}") is None:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{name}")
    assert missing == []


def test_the_architecture_map_names_every_module():
    """docs/architecture.md is the map a newcomer reads first: a module it leaves out is a room with no door."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(str(m.path.relative_to(ROOT)) for m in MODULES.values()
                     if m.path.name != "__init__.py" and "models" not in m.path.parts
                     and not re.search(rf"\b{re.escape(m.path.name)}\b", text))
    assert not missing, f"docs/architecture.md does not name {', '.join(missing)}"


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Every cycle of module imports (lazy ones included; a package's __init__ counts as its own module),
    each as the modules around it, found by a depth-first search."""
    known = modules(root)
    graph = {name: sorted({imported for _, imported in imports(module, known) if imported in known} - {name})
             for name, module in known.items()}
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in graph[name]:
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_circle_anywhere():
    """Data and imports flow one way inside a layer too: a circle (package.py importing target.py, which imports
    package.py lazily) means two modules that cannot be read, tested or moved apart."""
    packages = {m.name for m in MODULES.values() if m.path.name == "__init__.py"}
    circles = [" -> ".join(c) for c in import_cycles() if not set(c) & packages]
    assert not circles, "import circles: " + "; ".join(circles)
