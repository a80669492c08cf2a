"""bench/gpu/check.sh, the prepared GPU check (issue 53), in its tiny mode on the CPU: it installs lpes from the
working tree into a folder of its own, measures lpes's search replica, runs lpes-search on the CPU in float32 and
in bfloat16, lpes-convert --to hf and lpes-validate, and writes one JSON. Run here so that the script cannot rot
while no GPU is at hand; on the CPU the "device" is the CPU, so the float32 comparison holds the CPU run against
itself (the script says so), and bfloat16 runs on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "bench" / "gpu"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _module("check")
install = _module("install")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """check.sh --tiny, once for the file: its output and its JSON."""
    work = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "LPES_GPU_WORK": str(work / "work"),
           "CUDA_VISIBLE_DEVICES": ""}  # the CPU path, whatever machine runs the suite
    done = subprocess.run(["bash", str(GPU / "check.sh"), "--tiny", "--out", str(work / "out")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=work)
    result = work / "out" / "gpu_check.json"
    return done, json.loads(result.read_text()) if result.is_file() else {}


@pytest.mark.slow
def test_tiny_mode_passes_every_check_and_prints_one_line_each(tiny_run):
    done, result = tiny_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for prefix in ("replica: cpu bfloat16", "search-bfloat16: passed", "search-float32: passed", "validate: passed",
                   "total wall time:", "check.sh: total wall time"):
        assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, done.stdout)
    assert "the CPU run against itself" in done.stdout
    assert result["mode"] == "tiny" and result["device"] == "cpu" and result["seconds"] > 0
    # The lpes that ran is the one check.sh installed, not the working tree's.
    assert "/site/lpes/search/" in result["lpes"] and not result["lpes"].startswith(str(ROOT))


@pytest.mark.slow
def test_tiny_mode_measures_the_replica(tiny_run):
    _, result = tiny_run
    r, mode = result["replica"], check.TINY
    assert r["dtype"] == "bfloat16" and r["prompt_positions"] == mode.positions
    assert r["weights_bytes"] == 2 * r["parameters"] > 0
    assert len(r["curve"]) == mode.shape["num_hidden_layers"] and len(set(r["curve"])) > 1  # lpes's patched RoPE
    # Teacher forcing computes each prompt once (prompt + answer - 1 positions, a one-token answer); decoding
    # computes one position per row per step, as transformers' generate would.
    assert r["prefill"]["positions"] == mode.prefill_prompts * mode.positions
    assert r["decode"]["positions"] == mode.decode_prompts * mode.decode_steps
    assert r["prefill"]["positions_per_s"] > 0 and r["decode"]["positions_per_s"] > 0
    est = r["estimate"]
    per_verdict = est["prompt_tokens"] * est["seconds_per_token"] + est["decode_steps"] * est["step_seconds"]
    assert est["seconds_per_verdict"] == pytest.approx(per_verdict, rel=1e-3)
    bound = est["search_hours"]["bound (no racing gain)"]
    assert bound == pytest.approx(13900 * per_verdict / 3600, rel=1e-2)
    assert est["total_hours_at_bound"] > bound > est["search_hours"]["as lpes-tiny-kv"] > 0


@pytest.mark.slow
def test_tiny_mode_holds_the_device_search_against_the_cpu(tiny_run):
    _, result = tiny_run
    assert all(c["returncode"] == 0 for c in result["commands"].values()), result["commands"]
    bf16, fp32 = result["checks"]["search-bfloat16"], result["checks"]["search-float32"]
    assert bf16["search_dtype"] == "bfloat16" and bf16["run"] == "search-bfloat16"
    assert fp32["run"] == "search-cpu-float32"  # no GPU: the CPU run is the device's float32 run
    for c in (bf16, fp32):
        assert c["passed"] and c["same_decision"] and c["decision"] == c["cpu_decision"]
        assert c["rows"] and all(row["prompts"] == 20 and row["differ"] <= row["allowed"] for row in c["rows"].values())
        assert c["replicas"]["devices"] == [["cpu"]]
    assert bf16["tolerance"] == 0.05 and fp32["tolerance"] == 0.0
    assert fp32["same_curve"] and all(row["differ"] == 0 for row in fp32["rows"].values())


@pytest.mark.slow
def test_tiny_mode_validates_the_hub_folder_in_both_dtypes(tiny_run):
    _, result = tiny_run
    v = result["checks"]["validate"]
    assert v["passed"] and [c["name"] for c in v["commands"]] == ["convert", "validate-bfloat16"]
    assert all(c["returncode"] == 0 for c in v["commands"])
    runs = v["runs"]
    assert runs["convert-float32"]["hf_dtype"] == "float32" and runs["validate-bfloat16"]["hf_dtype"] == "bfloat16"
    for row in runs.values():
        assert row["verdict"] == "passed" and row["examples"] == 10
        assert row["hf_passed"] and row["hf_differ"] <= row["hf_allowed"]
        assert {"unscaled", "reference", "hf"} <= set(row["accuracy"])
    bf16 = runs["validate-bfloat16"]
    assert bf16["reference_vs_cpu_differ"] <= bf16["reference_vs_cpu_allowed"]


def _spec(rows: dict[str, str], ship: str, scales=(1.0, 2.0)) -> dict:
    decision = {"ship": {"name": ship}, "rows": [{"name": n, "verdicts": v} for n, v in rows.items()]}
    return {"scales": list(scales), "provenance": {"decision": decision, "held_out": {}, "search": {"dtype": "x"},
                                                   "replicas": {}}}


def test_the_search_comparison_holds_each_dtype_to_its_tolerance():
    cpu = _spec({"unscaled": "1" * 40, "YaRN f=2": "10" * 20}, "unscaled")
    one_flip = _spec({"unscaled": "0" + "1" * 39, "YaRN f=2": "10" * 20}, "unscaled")
    assert check.compare_searches(cpu, cpu, "float32")["passed"]
    assert not check.compare_searches(cpu, one_flip, "float32")["passed"]  # float32: no flip allowed
    assert check.compare_searches(cpu, one_flip, "bfloat16")["passed"]  # 1 of 40 within 5%
    three = _spec({"unscaled": "000" + "1" * 37, "YaRN f=2": "10" * 20}, "unscaled")
    assert check.compare_searches(cpu, three, "bfloat16")["rows"]["unscaled"] == {"prompts": 40, "differ": 3,
                                                                                  "allowed": 2}
    assert not check.compare_searches(cpu, three, "bfloat16")["passed"]
    assert not check.compare_searches(cpu, _spec({"unscaled": "1" * 40, "YaRN f=2": "10" * 20}, "YaRN f=2"),
                                      "bfloat16")["passed"]  # another decision
    other_curve = _spec({"unscaled": "1" * 40, "YaRN f=2": "10" * 20}, "unscaled", (1.0, 2.5))
    assert check.compare_searches(cpu, other_curve, "bfloat16")["passed"]
    assert not check.compare_searches(cpu, other_curve, "float32")["passed"]  # float32: the same spec


def test_without_pip_lpes_is_copied_by_package_dir_with_a_launcher_per_command(tmp_path):
    site = tmp_path / "site"
    install.copy_install(site)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package in install.package_dirs(pyproject):
        assert (site / Path(*package.split(".")) / "__init__.py").is_file(), package
    assert (site / "lpes" / "models" / "lpes-tiny-induction" / "model.safetensors").is_file()
    assert set(install.console_scripts(pyproject)) == {"lpes-convert", "lpes-search", "lpes-validate",
                                                       "lpes-generate"}
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([str(site / "bin" / "lpes-search"), "--help"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: lpes-search"), done.stderr
    # cwd outside the tree: `python -c` puts the working directory first on sys.path, and the tree's lpes/ is a package.
    where = subprocess.run([sys.executable, "-c", "import lpes.search.run as m; print(m.__file__)"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert where.stdout.strip() == str(site / "lpes" / "search" / "run.py"), where.stderr


def test_a_missing_wheel_is_named_with_the_command_that_fetches_it(tmp_path):
    with pytest.raises(SystemExit, match="make gpu-wheels"):
        install.find_wheel("cmaes", tmp_path)


def test_the_gpu_run_searches_and_converts_at_make_demos_settings():
    recipe = (ROOT / "Makefile").read_text().split("\ndemo: install\n", 1)[1].split("\n\n", 1)[0]
    search_line = next(line for line in recipe.splitlines() if "lpes-search" in line)
    convert_line = next(line for line in recipe.splitlines() if "lpes-convert" in line)
    assert f"lpes-search {check.MODEL} " in search_line and " ".join(check.DEMO_SEARCH) in search_line
    assert f"--data {check.FULL.data} " in convert_line
    assert check.FULL.search == tuple(check.DEMO_SEARCH) and check.FULL.shape == check.LLAMA3_8B


def test_a_step_that_fails_is_recorded_and_the_other_lines_still_print():
    def broken(*_):
        raise RuntimeError("CUDA out of memory")

    failed = check.guarded(broken, check.TINY, "cuda")
    assert failed["passed"] is False and failed["error"] == "RuntimeError: CUDA out of memory"
    result = {"mode": "full", "device": "NVIDIA H100", "seconds": 1.0, "replica": failed,
              "checks": {"search-bfloat16": {"passed": False, "why": "a search did not finish"},
                         "search-float32": {"passed": False, "why": "a search did not finish"}, "validate": failed}}
    lines = check.summary(result)
    assert len(lines) == 5 and all("FAILED" in line for line in lines[:4]), lines
    assert lines[0] == "replica: FAILED (RuntimeError: CUDA out of memory)"
