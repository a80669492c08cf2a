"""One preflight for every command (validation/model_preflight.py): a refusal added to it once reaches lpes-convert,
lpes-search, lpes-validate and lpes-generate, as their only line, before torch loads; and what it resolves is
what the stages after it take (no stage reads the config again)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lpes.foundation.spec import Spec, dump_spec
from lpes.foundation.spec_file import SPEC_FILE

# Appended to the preflight's CHECKS in a fresh interpreter, then the command runs: what it prints and imports.
RUN_WITH_ONE_MORE_CHECK = """
import sys
from lpes.foundation.errors import LpesError
from lpes.validation import model_preflight
from lpes import cli

def refuse(request):
    raise LpesError(f"refused by the one added check ({request.command})")

model_preflight.CHECKS.append(refuse)
code = getattr(cli, sys.argv[1])(sys.argv[2:])
print(code, sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def _inputs(tmp_path: Path) -> dict[str, list[str]]:
    """Arguments each command accepts up to its preflight: a spec file, a converted folder, an ONNX folder."""
    spec = tmp_path / "best.json"
    dump_spec(Spec.from_scales([1.5, 1.0, 1.0, 1.0]), spec)
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / SPEC_FILE).write_bytes(spec.read_bytes())
    onnx = tmp_path / "onnx"
    onnx.mkdir()
    (onnx / "model.onnx").write_bytes(b"")
    return {
        "convert_main": ["lpes-tiny-kv", "--curve", str(spec), "--to", "hf", "--out", str(tmp_path / "out")],
        "search_main": ["lpes-tiny-kv", "--out", str(tmp_path / "search" / "best.json")],
        "validate_main": [str(converted)],
        "generate_main": [str(onnx), "p3_1 q3"],
    }


@pytest.mark.parametrize("main", ["convert_main", "search_main", "validate_main", "generate_main"])
def test_a_refusal_added_to_the_preflight_once_reaches_every_command(main, tmp_path):
    argv = _inputs(tmp_path)[main]
    done = subprocess.run([sys.executable, "-c", RUN_WITH_ONE_MORE_CHECK, main, *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    command = "lpes-" + main.removesuffix("_main")
    code, imported = done.stdout.split(maxsplit=1)
    assert code == "2", done.stderr
    assert done.stderr.splitlines() == [f"{command}: error: refused by the one added check ({command})"]
    assert json.loads(imported.replace("'", '"')) == []  # before torch or transformers loads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "converted", "onnx"]  # nothing written


def test_the_stages_take_what_the_preflight_resolved(tmp_path, monkeypatch):
    """lpes-convert to hf and onnx, validated: the config is resolved once, by the preflight (the loaders' own reads
    of config.json, converter/loading.py, aside); every stage after it takes that one."""
    import inspect

    from lpes.cli import convert_main
    from lpes.converter import loading

    callers = []
    real = loading.load_config

    def counted(path):
        caller = inspect.stack()[1]
        if Path(caller.filename).name != "loading.py":
            callers.append(f"{Path(caller.filename).name}:{caller.function}")
        return real(path)

    monkeypatch.setattr(loading, "load_config", counted)
    spec = tmp_path / "best.json"
    dump_spec(Spec.from_scales([1.5, 1.0, 1.0, 1.0]), spec)
    code = convert_main(["lpes-tiny-kv", "--curve", str(spec), "--to", "hf,onnx", "--out", str(tmp_path / "out"),
                         "--data", "tiny-kv:examples=1"])
    assert code == 0
    assert callers == ["model_preflight.py:_with_model"]
