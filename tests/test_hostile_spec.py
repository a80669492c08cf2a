"""Hostile and mistaken spec files (issue 17): each is refused with one line naming the field.

Every row here was accepted (and did the wrong thing) or ended in a traceback before the loader
was made strict. The CLI rows check the promise end to end: exit 2, one line, no traceback.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from lpes.foundation.errors import LpesError
from lpes.foundation.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
CURVE = {"control_points": [[0, 4.0], [1, 2.25], [2, 1.25], [3, 1.0]]}


def spec_json(**fields) -> str:
    return json.dumps(fields)


def nested(depth: int) -> str:
    return '{"scales": [1, 1, 1, 1], "provenance": {"deep": ' + "[" * depth + "]" * depth + "}}"


HOSTILE = [
    # Accepted but wrong: scales that are 0 in float32, or far outside any sane interpolation factor.
    ("scale 1e-300", spec_json(scales=[1e-300, 1, 1, 1]), "'scales[0]' is 1e-300"),
    ("scale 1e-46", spec_json(scales=[1, 1e-46, 1, 1]), "'scales[1]' is 1e-46"),
    ("scale 5e-324", spec_json(scales=[1, 1, 5e-324, 1]), "'scales[2]' is 5e-324"),
    ("scale 1e30", spec_json(scales=[1, 1, 1, 1e30]), "'scales[3]' is 1e+30"),
    ("curve y 1e-300", spec_json(control_points=[[0, 1e-300], [3, 1]]), "'control_points[0]' has scale (y) 1e-300"),
    # Bools where numbers go (JSON true == 1 in Python).
    ("version true", spec_json(version=True, scales=[1]), "'version' must be the integer 1, got True"),
    ("degree true", spec_json(curve={"degree": True, "control_points": [[0, 1], [1, 2]]}),
     "'curve.degree' must be an integer, got True"),
    ("num_layers true", spec_json(num_layers=True, scales=[1]), "'num_layers' must be an integer"),
    ("scale true", spec_json(scales=[1, True]), "'scales[1]' must be a number, got True"),
    ("control point true", spec_json(control_points=[[0, True], [1, 2]]), "'control_points[0]'"),
    # Unknown keys (typos) at every level but provenance; duplicate keys anywhere.
    ("typo scale", spec_json(scale=[2, 2, 2, 2]), "unknown key 'scale' (did you mean 'scales'?)"),
    ("typo beside scales", spec_json(scales=[2, 2, 2, 2], num_layer=4), "unknown key 'num_layer' (did you mean"),
    ("typo in curve", spec_json(curve={"control_point": [[0, 1], [1, 2]]}),
     "unknown key 'control_point' in 'curve' (did you mean 'control_points'?)"),
    ("unrelated key", spec_json(scales=[1], zzz=1), "unknown key 'zzz' (known keys:"),
    ("duplicate scales", '{"scales": [1, 1], "scales": [4, 4]}', "duplicate key 'scales'"),
    ("duplicate in provenance", '{"scales": [1], "provenance": {"a": 1, "a": 2}}', "duplicate key 'a'"),
    ("curve given twice", spec_json(curve=CURVE, control_points=[[0, 1], [1, 2]]), "not both"),
    ("degree without points", spec_json(scales=[1], degree=3), "'degree' at the top level"),
    # Degenerate curves.
    ("all x equal", spec_json(control_points=[[2, 1], [2, 3], [2, 2]]), "x span"),
    ("x span overflows", spec_json(control_points=[[-1e308, 1], [1e308, 2]]), "x span"),
    ("degree 40", spec_json(control_points=[[i, 1 + i % 3] for i in range(41)]), "degree must be at most 16"),
    ("1200 control points", spec_json(control_points=[[i, 2] for i in range(1200)]), "degree must be at most 16"),
    # Sizes beyond sane bounds, refused before anything is allocated.
    ("num_layers 1e12", spec_json(num_layers=10**12, **CURVE), "'num_layers' must be an integer in 1..4096"),
    ("num_layers 1e12 float", '{"num_layers": 1e12, "scales": [1]}', "'num_layers' must be an integer in 1..4096"),
    ("5000 scales", spec_json(scales=[1] * 5000), "'scales' has 5000 entries; at most 4096"),
    ("huge integer", '{"num_layers": 1' + "0" * 5000 + ', "scales": [1]}', "'num_layers' is an integer of 5001 digits"),
    ("huge integer in provenance", '{"scales": [1], "provenance": {"seed": ' + "9" * 5000 + "}}",
     "'provenance.seed' is an integer of 5000 digits"),
    ("huge integer scale", '{"scales": [' + "9" * 400 + "]}", "'scales[0]'"),
    ("100k-deep JSON", nested(100_000), "nested deeper than"),
    ("500-deep JSON", nested(500), "nested deeper than"),
    # Misleading counts: the spec, not the model, said 4.
    ("num_layers disagrees", spec_json(num_layers=4, scales=[1, 1, 1]), "'scales' has 3 entries but 'num_layers' is 4"),
    # Provenance that another stage reads is typed.
    ("provenance.search list", spec_json(scales=[1], provenance={"search": [1, 2]}),
     "'provenance.search' must be an object"),
    ("best_uniform_scale string", spec_json(scales=[1], provenance={"search": {"best_uniform_scale": "2"}}),
     "'provenance.search.best_uniform_scale' must be a number"),
    ("best_uniform_scale 0", spec_json(scales=[1], provenance={"search": {"best_uniform_scale": 0}}),
     "'provenance.search.best_uniform_scale' is 0"),
    ("stock_baselines object", spec_json(scales=[1], provenance={"search": {"stock_baselines": {"yarn": 2}}}),
     "'provenance.search.stock_baselines' must be a list"),
    ("stock_baselines unknown type",
     spec_json(scales=[1], provenance={"search": {"stock_baselines": [{"rope_type": "ntk", "factor": 2}]}}),
     "stock_baselines[0].rope_type' must be one of yarn, dynamic, got 'ntk'"),
    ("stock_baselines factor below 1",
     spec_json(scales=[1], provenance={"search": {"stock_baselines": [{"rope_type": "yarn", "factor": 0.5}]}}),
     "stock_baselines[0].factor' must be a number in [1, 10000], got 0.5"),
    ("stock_baselines factor bool",
     spec_json(scales=[1], provenance={"search": {"stock_baselines": [{"rope_type": "yarn", "factor": True}]}}),
     "factor' must be a number"),
    ("stock_baselines twice", spec_json(scales=[1], provenance={"search": {"stock_baselines": [
        {"rope_type": "yarn", "factor": 2}, {"rope_type": "yarn", "factor": 3}]}}), "'yarn' appears twice"),
    ("base_model number", spec_json(scales=[1], provenance={"base_model": 5}), "'provenance.base_model' must be a"),
    ("provenance.model list", spec_json(scales=[1], provenance={"model": []}), "'provenance.model' must be an object"),
    # Not JSON at all.
    ("empty file", "", "not valid JSON"),
    ("huge file", '{"scales": [1], "provenance": {"pad": "' + "x" * (8 << 20) + '"}}', "larger than 8 MiB"),
]


@pytest.mark.parametrize("name, content, fragment", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_hostile_spec_is_refused_with_one_line(tmp_path, name, content, fragment):
    path = tmp_path / "best.json"
    path.write_text(content)
    with pytest.raises(LpesError) as err:
        load_spec(path)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 400


def test_a_directory_is_not_reported_as_missing(tmp_path):
    with pytest.raises(LpesError, match="is a directory"):
        load_spec(tmp_path)


def test_a_device_is_refused_without_reading_it():
    with pytest.raises(LpesError, match="not a regular file"):
        load_spec("/dev/zero")


@contextmanager
def unprivileged():
    """Root reads any file; drop the effective uid so that permissions apply, as for a user."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.mark.parametrize("unreadable", ["file", "folder"])
def test_permission_denied_is_one_line(unreadable):
    root = Path(tempfile.mkdtemp())  # not pytest's tmp_path: its parents are 0700, closed to other users
    try:
        root.chmod(0o755)
        (root / "d").mkdir()
        path = root / "d" / "best.json"
        path.write_text(spec_json(scales=[1]))
        (path if unreadable == "file" else path.parent).chmod(0)
        with unprivileged(), pytest.raises(LpesError) as err:
            load_spec(path)
        assert "permission denied" in str(err.value) and "\n" not in str(err.value)
    finally:
        (root / "d").chmod(stat.S_IRWXU)
        subprocess.run(["rm", "-rf", str(root)], check=True)


CLI_ROWS = [
    ("lpes-convert", "huge integer", '{"num_layers": 1' + "0" * 5000 + ', "scales": [1]}', "'num_layers'"),
    ("lpes-convert", "100k-deep JSON", nested(100_000), "nested deeper than"),
    ("lpes-convert", "a directory", None, "is a directory"),
    ("lpes-convert", "typo beside scales", spec_json(scales=[2, 2, 2, 2], degre=3), "unknown key 'degre'"),
    ("lpes-validate", "huge integer", '{"num_layers": 1' + "0" * 5000 + ', "scales": [1]}', "'num_layers'"),
    ("lpes-validate", "provenance.search list", spec_json(scales=[1, 1, 1, 1], provenance={"search": []}),
     "'provenance.search' must be an object"),
]


@pytest.mark.parametrize("command, name, content, fragment", CLI_ROWS, ids=[f"{r[0]}: {r[1]}" for r in CLI_ROWS])
def test_cli_exits_2_with_one_line(tmp_path, command, name, content, fragment):
    spec = tmp_path / "run" / "lpes_spec.json"
    spec.parent.mkdir()
    if content is None:
        spec.mkdir()
    else:
        spec.write_text(content)
    out = tmp_path / "x"
    if command == "lpes-convert":
        args = ["lpes-tiny-kv", "--curve", str(spec), "--to", "hf", "--out", str(out)]
    else:
        args = [str(spec.parent), "--model", "lpes-tiny-kv"]
    exe = Path(sys.executable).with_name(command)
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(f"{command}: error: ") and fragment in lines[0]
    assert not out.exists()
