"""README's block "Then, on its output", run for real after `make demo`: every line succeeds and the
demo's files stay byte for byte as the demo left them.

It needs a finished `make demo` (minutes), so the suite skips it; `make demo-check` runs it in a fresh
clone of the committed tree (clone, `make demo`, this test with LPES_AFTER_DEMO=1), and `.ci/run` runs
`make demo-check` after `make test`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_help_examples import DEMO_OUT, README, block_after

ROOT = README.parent
DEMO = ROOT / DEMO_OUT
NEXT = DEMO / "next"


def digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under `folder` but the README block's own `next/`, by relative path."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and NEXT not in path.parents}


@pytest.mark.skipif(not os.environ.get("LPES_AFTER_DEMO"), reason="runs after make demo: make demo-check")
def test_readme_block_after_the_demo_runs_and_changes_none_of_the_demos_files():
    assert (DEMO / "best.json").is_file(), f"no {DEMO_OUT}/best.json: run make demo first"
    shutil.rmtree(NEXT, ignore_errors=True)  # the block's own output, from an earlier run of this test
    before = digests(DEMO)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    block = block_after(README.read_text(), "Then, on its output")
    outputs = []
    for line in block:
        result = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{line}\nexit {result.returncode}\n{result.stderr[-2000:]}"
        outputs.append(result.stdout)
    assert digests(DEMO) == before
    assert NEXT.is_dir()
    generate = next(out for line, out in zip(block, outputs) if line.startswith("lpes-generate"))
    assert generate.split() == ["v5"], generate  # what README says the line prints


@pytest.mark.skipif(not os.environ.get("LPES_AFTER_DEMO"), reason="runs after make demo: make demo-check")
def test_what_readme_says_make_demo_leaves_is_there():
    """README's "It leaves:" block: its first word on each line is a path under demo-out/ the demo wrote."""
    listed = [line.split()[0] for line in block_after(README.read_text(), "It leaves:")
              if line.split()[0].startswith(f"{DEMO_OUT}/")]
    assert len(listed) >= 4, listed  # the block moved or lost its indentation: nothing would be checked
    assert [path for path in listed if not (ROOT / path).exists()] == []


@pytest.mark.skipif(not os.environ.get("LPES_AFTER_DEMO"), reason="runs after make demo: make demo-check")
def test_the_demo_shipped_what_its_decision_and_closing_words_say():
    """make demo's closing words: the decision is YaRN, the per-layer curve is not shipped, and the Hub folder is
    stock YaRN with no custom code. Read off the demo's own best.json and the folder lpes-convert wrote."""
    import json

    from test_bring_your_own import demo_words

    words = demo_words()
    decision = json.loads((DEMO / "best.json").read_text())["provenance"]["decision"]
    assert decision["prompts"] == 200
    assert decision["ship"]["kind"] == "stock" and decision["ship"]["rope_type"] == "yarn", decision["reason"]
    assert "the decision is YaRN" in words
    rows = {row["kind"]: row for row in decision["rows"]}
    if "per-layer" in rows:  # "YaRN ... answers more held-out prompts than the per-layer curve"
        yarn = next(row for row in decision["rows"] if row["rope_type"] == "yarn")
        assert yarn["right"] > rows["per-layer"]["right"]
    hub = DEMO / "lpes-tiny-induction-lpes"
    config = json.loads((hub / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn" and "auto_map" not in config
    assert not (hub / "modeling_lpes.py").exists()
