"""One prepared GPU check (issue 53): lpes's search replica, lpes-search, lpes-convert and lpes-validate on CUDA.

bench/gpu/check.sh installs lpes from the working tree (bench/gpu/install.py) and runs this. Four checks, one line
each, every figure in one JSON (OUT/gpu_check.json):

- replica: a random-weight model of Llama-3-8B's shape, built in GPU memory in bfloat16 (no download, no disk),
  scored by lpes's search replica (search/replica.py, its loader swapped for the built model) on 4k-position
  prompts: positions per second of prefill (teacher forcing, the search's calibration verdict) and of decode
  (greedy, the held-out verdict), peak GPU memory; from them the GPU time of the default 7B search by
  bench/RESULTS.md's formula (issue 25), in place of the cited TensorRT-LLM rate.
- search-bfloat16, search-float32: lpes-search on lpes-tiny-induction at make demo's settings on the device, each
  against the same search on the CPU in float32: the same decision, and on every held-out row of the decision the
  verdicts within the tolerance lpes documents for the dtype (validation/variant_runs.MAX_DISAGREEMENT: none in
  float32, 5% of prompts in bfloat16); in float32 also the same curve.
- validate: lpes-convert --to hf of make demo's per-layer curve (the Hub folder with lpes's RoPE code) validated
  on the device in float32, then lpes-validate on the device in bfloat16 and on the CPU in float32: each report's
  verdict, the Hub folder against the reference within the tolerance the report states, and the device's
  reference against the CPU's, prompt by prompt.

--tiny: the same steps at a small shape and tiny settings, on the CPU when there is no GPU (tests/test_gpu_check.py
runs it in make test, so the script cannot rot while no GPU is at hand). There the "device" is the CPU too: the
float32 comparisons hold the CPU against itself, and bfloat16 runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# Llama-3-8B (meta-llama/Meta-Llama-3-8B's config.json): 8.03 B parameters, 16.1 GB in bfloat16.
LLAMA3_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": False}
TINY_LLAMA = {**LLAMA3_8B, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024, "max_position_embeddings": 512}
MODEL = "lpes-tiny-induction"
# make demo's search (Makefile) and the curve it found (docs/results.md), shipped as a per-layer Hub folder.
DEMO_SEARCH = ["--data", "tiny-induction:examples=20", "--scale-grid", "0.5:4:0.25"]
DEMO_CURVE = (1.0, 2.35, 2.98, 3.5)
# bench/RESULTS.md, "Estimate: a 7B search on one GPU": verdicts of a default search (racing as on lpes-tiny-kv,
# as on lpes-tiny-induction, and the bound without racing gain), the stock scan and the held-out prompts, at
# 5,500 prompt tokens and 100 decode steps per verdict.
VERDICTS = {"as lpes-tiny-kv": 1610, "as lpes-tiny-induction": 2956, "bound (no racing gain)": 13900}
BASELINE_VERDICTS, HELD_OUT_VERDICTS = 2600, 200
ESTIMATE_PROMPT, ESTIMATE_DECODE = 5500, 100


@dataclass(frozen=True)
class Mode:
    """The sizes of one run: the GPU's (full) or make test's (tiny)."""

    name: str
    shape: dict
    positions: int  # prompt positions of the replica's prompts
    prefill_prompts: int
    decode_prompts: int  # rows decoded together: within one of the replica's wide batches
    decode_steps: int
    search: tuple[str, ...]  # lpes-search's flags after the model and --out
    data: str  # lpes-convert's and lpes-validate's --data
    timeout_s: int  # per command


FULL = Mode("full", LLAMA3_8B, 4096, 16, 4, 32, tuple(DEMO_SEARCH), "tiny-induction:examples=40", 420)
TINY = Mode("tiny", TINY_LLAMA, 256, 4, 2, 4,
            ("--data", "tiny-induction:examples=1", "--holdout", "20", "--population", "2", "--generations", "1",
             "--scale-grid", "0.5:4:0.5", "--baselines", "yarn"), "tiny-induction:examples=2", 240)


# ---- the replica on a Llama-3-8B-shaped model ----


def build_model(shape: dict, dtype: str, device: str):
    """A random-weight Llama of `shape`, built where it runs: on a GPU no host copy of 16 GB is ever made."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lpes.converter.loading import torch_dtype

    # No end token: every row decodes its whole budget, so the decode steps timed are the steps asked for.
    config = LlamaConfig(**shape, bos_token_id=1, pad_token_id=0, eos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    return model.eval()


def kv_tokenizer(vocab_size: int):
    """lpes-tiny-kv's word-level tokenizer with a word for every further id of the model, so that whatever id a
    random model writes decodes."""
    from lpes.validation.tiny_kv import BOS_TOKEN, PAD_TOKEN, token_ids, word_level_tokenizer

    vocab = dict(token_ids())
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    return word_level_tokenizer(vocab, BOS_TOKEN, PAD_TOKEN)


def kv_examples(mode: Mode, count: int, seed: int, answer_tokens: int | None) -> list:
    """`count` tiny-kv prompts of `mode.positions` positions (lpes's task generator), gold first and last."""
    from lpes.validation.tasks import TaskConfig, examples_for

    task = TaskConfig(task="tiny-kv", num_pairs=16, gold_indices=(0, 15), examples_per_index=-(-count // 2),
                      seed=seed, length=mode.positions, answer_tokens=answer_tokens)
    return examples_for(task, split="search")[:count]


def open_replica(model, tokenizer, examples: list, dtype: str):
    """lpes's search replica (search/replica.py) around `model`: Replica's own constructor, its loader swapped
    for the model built in memory (writing 16 GB of random weights to disk to read them back would time the disk)."""
    from unittest import mock

    from lpes.exporters.runners import model_device
    from lpes.search import replica

    device = str(model_device(model))
    with mock.patch.object(replica, "load_replica", lambda *_: model):
        return replica.Replica(0, "in-memory", [device], dtype, tokenizer, examples, "teacher-forced", 8)


def measure_replica(mode: Mode, device: str, dtype: str = "bfloat16") -> dict:
    """Positions per second of the replica's prefill and decode at `mode.positions`, and peak memory."""
    import torch

    started = time.perf_counter()
    model = build_model(mode.shape, dtype, device)
    built = time.perf_counter() - started
    layers = mode.shape["num_hidden_layers"]
    # A per-layer curve, so that lpes's patched RoPE runs (scale 1 everywhere keeps the model's own tensors).
    curve = tuple(round(1.0 + i / max(1, layers - 1), 4) for i in range(layers))
    prefill = kv_examples(mode, mode.prefill_prompts, 0, None)  # teacher forcing: one pass a prompt
    prompts = kv_examples(mode, mode.decode_prompts, 1, None)
    # The same prompts with 1 and with 1 + decode_steps answer tokens (greedy): the difference is the decode.
    short = [replace(e, answer_tokens=1) for e in prompts]
    long = [replace(e, answer_tokens=1 + mode.decode_steps) for e in prompts]
    warm = kv_examples(mode, 2, 2, None) + kv_examples(mode, 1, 3, 2)  # both paths, before anything is timed
    groups = [warm[:2], warm[2:], prefill, short, long]
    replica = open_replica(model, tokenizer=kv_tokenizer(mode.shape["vocab_size"]), dtype=dtype,
                           examples=[e for group in groups for e in group])
    timed = _time_replica(replica, curve, _ranges([len(g) for g in groups]), device)
    tf, one, many = timed["prefill"], timed["short"], timed["long"]
    decode_seconds = many.busy_s - one.busy_s
    decode_positions = many.forward_tokens - one.forward_tokens  # rows x decode steps, as generate computes them
    out = {
        "device": _device_name(device), "dtype": dtype, "shape": mode.shape, "curve": list(curve),
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "build_seconds": round(built, 2), "prompt_positions": mode.positions,
        "prefill": {"prompts": len(prefill), "positions": tf.forward_tokens, "seconds": round(tf.busy_s, 3),
                    "positions_per_s": round(tf.forward_tokens / tf.busy_s, 1), "peak_bytes": timed["prefill_peak"]},
        "decode": {"rows": len(prompts), "steps": mode.decode_steps, "positions": decode_positions,
                   "seconds": round(decode_seconds, 3),
                   "positions_per_s": round(decode_positions / decode_seconds, 1) if decode_seconds > 0 else None,
                   "step_seconds": round(decode_seconds / mode.decode_steps, 5), "peak_bytes": timed["decode_peak"],
                   "prefill_only_seconds": round(one.busy_s, 3)},
    }
    out["estimate"] = search_estimate(out, mode.shape)
    del replica, model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def _time_replica(replica, curve: tuple[float, ...], ids: list[list[int]], device: str) -> dict:
    """The replica's ShareResults (verdicts, positions, busy seconds) on the groups of `ids`: two warm-ups, the
    prefill, the short and the long answers; peak memory of the prefill and of the decode."""
    replica.score(curve, ids[0])
    replica.score(curve, ids[1])
    _reset_peak(device)
    timed = {"prefill": replica.score(curve, ids[2]), "prefill_peak": _peak(device)}
    _reset_peak(device)
    timed.update(short=replica.score(curve, ids[3]), long=replica.score(curve, ids[4]), decode_peak=_peak(device))
    return timed


def _ranges(sizes: list[int]) -> list[list[int]]:
    """Consecutive id ranges of the given sizes: the replica's examples are the groups one after another."""
    out, start = [], 0
    for size in sizes:
        out.append(list(range(start, start + size)))
        start += size
    return out


def flops_per_token(parameters: int, layers: int, hidden: int, prompt: int) -> float:
    """bench/RESULTS.md's F = 2 N + 2 L P d: the weights, plus causal attention at the mean context P / 2."""
    return 2 * parameters + 2 * layers * prompt * hidden


def search_estimate(measured: dict, shape: dict) -> dict:
    """bench/RESULTS.md's GPU-hours = V x (P x t_token + D x t_step) / 3600 with this run's rates: t_token the
    prefill's seconds per position scaled by F from the measured prompt length to P = 5,500, t_step the measured
    decode step (4 rows; a decode step is memory-bound, so about what one row costs: the batch-1 bound)."""
    layers, hidden = shape["num_hidden_layers"], shape["hidden_size"]
    measured_at = measured["prompt_positions"]
    scale = (flops_per_token(measured["parameters"], layers, hidden, ESTIMATE_PROMPT)
             / flops_per_token(measured["parameters"], layers, hidden, measured_at))
    t_token = scale / measured["prefill"]["positions_per_s"]
    t_step = measured["decode"]["step_seconds"]
    per_verdict = ESTIMATE_PROMPT * t_token + ESTIMATE_DECODE * t_step
    hours = {name: round(v * per_verdict / 3600, 3) for name, v in VERDICTS.items()}
    extra = (BASELINE_VERDICTS + HELD_OUT_VERDICTS) * per_verdict / 3600
    return {"prompt_tokens": ESTIMATE_PROMPT, "decode_steps": ESTIMATE_DECODE, "seconds_per_token": t_token,
            "step_seconds": t_step, "seconds_per_verdict": round(per_verdict, 4), "search_hours": hours,
            "baselines_and_held_out_hours": round(extra, 3),
            "total_hours_at_bound": round(hours["bound (no racing gain)"] + extra, 3)}


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: str) -> int | None:
    """Peak GPU memory allocated since the last reset; None on the CPU (the process's RSS is in the JSON)."""
    import torch

    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


# ---- the commands ----


@dataclass
class Command:
    """One lpes command as run: its argv, exit status, wall time and log."""

    name: str
    argv: list[str]
    returncode: int | None = None
    seconds: float | None = None
    log: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def run(name: str, argv: list[str], out: Path, timeout_s: int, env: dict | None = None) -> Command:
    """`argv` with its output in out/logs/NAME.log; a command past `timeout_s` is killed (returncode None)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    command = Command(name, argv, log=str(logs / f"{name}.log"))
    started = time.perf_counter()
    with open(command.log, "w") as log:
        try:
            command.returncode = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                                env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\ncheck: killed after {timeout_s} s\n")
    command.seconds = round(time.perf_counter() - started, 2)
    return command


def search(mode: Mode, out: Path, name: str, device: str, dtype: str, env: dict | None = None) -> Command:
    spec = out / name / "best.json"
    return run(name, ["lpes-search", MODEL, "--out", str(spec), *mode.search, "--force", "--device", device,
                      "--dtype", dtype], out, mode.timeout_s, env)


def compare_searches(cpu: dict, other: dict, dtype: str) -> dict:
    """The device's search against the CPU's: decision, curve, and each held-out row's verdicts."""
    from lpes.validation.variant_runs import MAX_DISAGREEMENT

    share = MAX_DISAGREEMENT[dtype]
    rows_cpu = {r["name"]: r["verdicts"] for r in cpu["provenance"]["decision"]["rows"]}
    rows_other = {r["name"]: r["verdicts"] for r in other["provenance"]["decision"]["rows"]}
    rows = {}
    for name in rows_cpu.keys() & rows_other.keys():
        a, b = rows_cpu[name], rows_other[name]
        rows[name] = {"prompts": len(a), "differ": sum(x != y for x, y in zip(a, b)), "allowed": int(share * len(a))}
    same_rows = rows_cpu.keys() == rows_other.keys()
    same_decision = cpu["provenance"]["decision"]["ship"] == other["provenance"]["decision"]["ship"]
    same_curve = cpu["scales"] == other["scales"]
    within = all(r["differ"] <= r["allowed"] for r in rows.values()) and all(len(v) for v in rows_other.values())
    # float32: the same spec (the tolerance is none); bfloat16: the same decision, near-ties may flip verdicts.
    passed = same_decision and within and (same_curve and same_rows if dtype == "float32" else True)
    return {"dtype": dtype, "tolerance": share, "same_decision": same_decision,
            "decision": other["provenance"]["decision"]["ship"]["name"],
            "cpu_decision": cpu["provenance"]["decision"]["ship"]["name"], "same_curve": same_curve,
            "scales": other["scales"], "cpu_scales": cpu["scales"], "rows": rows,
            "rows_only_cpu": sorted(rows_cpu.keys() - rows_other.keys()),
            "rows_only_device": sorted(rows_other.keys() - rows_cpu.keys()),
            "held_out": other["provenance"]["held_out"], "cpu_held_out": cpu["provenance"]["held_out"],
            "search_dtype": other["provenance"]["search"]["dtype"], "replicas": other["provenance"]["replicas"],
            "passed": passed}


def write_curve(path: Path) -> Path:
    """make demo's per-layer curve as a spec without a decision: lpes-convert ships the curve (custom code)."""
    from lpes.foundation.spec import Spec, dump_spec

    path.parent.mkdir(parents=True, exist_ok=True)
    dump_spec(Spec.from_scales(list(DEMO_CURVE)), path)
    return path


def convert_and_validate(mode: Mode, out: Path, device: str) -> dict:
    """lpes-convert --to hf (validated where it runs: CUDA when there is one, float32), then lpes-validate of
    copies of its folder on `device` in bfloat16 and on the CPU in float32, at once. Without a GPU the
    conversion's own validation is the CPU's float32 run, which is not run twice."""
    folder = out / "convert"
    curve = write_curve(out / "curve.json")
    convert = run("convert", ["lpes-convert", MODEL, "--curve", str(curve), "--to", "hf", "--out", str(folder),
                              "--data", mode.data, "--force"], out, mode.timeout_s)
    runs = {"validate-bfloat16": (device, "bfloat16")}
    if device != "cpu":
        runs["validate-cpu-float32"] = ("cpu", "float32")
    for name in runs:
        if folder.is_dir():
            shutil.copytree(folder, out / name, dirs_exist_ok=True)
    with ThreadPoolExecutor(len(runs)) as pool:
        done = list(pool.map(lambda item: run(item[0], ["lpes-validate", str(out / item[0]), "--data", mode.data,
                                                        "--device", item[1][0], "--dtype", item[1][1]],
                                              out, mode.timeout_s), runs.items()))
    reports = {"convert-float32": (_report(folder), convert.returncode)}
    reports.update({c.name: (_report(out / c.name), c.returncode) for c in done})
    cpu = reports.get("validate-cpu-float32", reports["convert-float32"])[0]
    return {"commands": [c.to_json() for c in [convert, *done]], **compare_reports(reports, cpu)}


def _report(folder: Path) -> dict | None:
    path = folder / "validation.json"
    return json.loads(path.read_text()) if path.is_file() else None


def compare_reports(reports: dict[str, tuple[dict | None, int | None]], cpu: dict | None) -> dict:
    """Each report's verdict and its Hub folder against its reference; each other reference against the CPU's
    float32 reference (`cpu`), prompt by prompt, within the tolerance of the run's dtype."""
    from lpes.validation.variant_runs import MAX_DISAGREEMENT

    out: dict[str, Any] = {"runs": {}}
    for name, (report, returncode) in reports.items():
        if report is None:
            out["runs"][name] = {"passed": False, "returncode": returncode, "why": "no validation.json"}
            continue
        hf = next((v for v in report["variants"] if v["name"] == "hf"), {})
        dtype = name.rsplit("-", 1)[-1]
        row = {"returncode": returncode, "verdict": report["verdict"], "examples": report["num_examples"],
               "hf_dtype": hf.get("dtype"), "hf_differ": len(hf.get("disagreements", [])),
               "hf_allowed": hf.get("allowed"), "hf_passed": hf.get("passed"),
               "accuracy": {v["name"]: v.get("accuracy") for v in report["variants"]}}
        passed = returncode == 0 and report["verdict"] == "passed" and hf.get("passed") is True
        if cpu is not None and report is not cpu:
            differ = _reference_differ(report, cpu)
            row.update(reference_vs_cpu_differ=differ,
                       reference_vs_cpu_allowed=int(MAX_DISAGREEMENT[dtype] * report["num_examples"]))
            passed &= differ <= row["reference_vs_cpu_allowed"]
        row["passed"] = passed
        out["runs"][name] = row
    out["passed"] = all(r["passed"] for r in out["runs"].values())
    return out


def _reference_differ(report: dict, cpu: dict) -> int:
    """Prompts on which the reference's greedy output differs from the CPU reference's (the same prompts)."""
    return sum(a["generated"].get("reference") != b["generated"].get("reference")
               for a, b in zip(report["examples"], cpu["examples"], strict=True))


# ---- the run ----


def pick_device(tiny: bool) -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if not tiny:
        raise SystemExit("check: no CUDA GPU here; --tiny runs the same steps on the CPU")
    return "cpu"


def run_all(mode: Mode, out: Path, device: str) -> tuple[dict, list[Command], dict]:
    """The CPU search beside the replica's measurement (one on the CPU, the other alone on the GPU); then the
    device's bfloat16 and float32 searches and the conversion with its validations, all at once (small models).
    Without a GPU the device's float32 search is the CPU's, which is not run twice."""
    threads = {"OMP_NUM_THREADS": os.environ.get("LPES_CPU_THREADS", "4" if mode is FULL else "1")}
    with ThreadPoolExecutor(1) as pool:
        cpu = pool.submit(search, mode, out, "search-cpu-float32", "cpu", "float32", threads)
        replica = guarded(measure_replica, mode, device)
        commands = [cpu.result()]
    dtypes = ("bfloat16", "float32") if device != "cpu" else ("bfloat16",)
    with ThreadPoolExecutor(1 + len(dtypes)) as pool:
        validation = pool.submit(guarded, convert_and_validate, mode, out, device)
        commands += list(pool.map(lambda dtype: search(mode, out, f"search-{dtype}", device, dtype), dtypes))
        return replica, commands, validation.result()


def guarded(step, *args) -> dict:
    """`step(*args)`, or what stopped it: on a one-shot GPU run one failed step must not cost the other checks
    their figures (the JSON and the lines are written either way)."""
    try:
        return step(*args)
    except Exception as err:  # noqa: BLE001 - recorded in the JSON, and the check fails
        return {"passed": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def search_checks(out: Path, commands: list[Command]) -> dict:
    """search-bfloat16 and search-float32 against the CPU's search (itself where the float32 one did not run)."""
    specs = {c.name: _spec(out / c.name / "best.json") if c.returncode == 0 else None for c in commands}
    cpu = specs["search-cpu-float32"]
    checks = {}
    for dtype in ("bfloat16", "float32"):
        other = specs.get(f"search-{dtype}", cpu)
        if cpu is None or other is None:
            checks[f"search-{dtype}"] = {"passed": False, "why": "a search did not finish (its log says why)"}
        else:
            checks[f"search-{dtype}"] = compare_searches(cpu, other, dtype)
            checks[f"search-{dtype}"]["run"] = f"search-{dtype}" if f"search-{dtype}" in specs else "search-cpu-float32"
    return checks


def _spec(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small shape and tiny settings (the CPU without a GPU)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"),
                        help="folder for the JSON, the specs, the folders and the logs (default: $OUT)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    mode = TINY if args.tiny else FULL
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(args.tiny)
    import torch
    import transformers

    from lpes.search import replica as replica_module  # where lpes came from: check.sh's install, not the tree

    result: dict[str, Any] = {"mode": mode.name, "device": _device_name(device), "lpes": replica_module.__file__,
                              "torch": torch.__version__, "transformers": transformers.__version__, "checks": {}}
    replica, commands, validation = run_all(mode, out, device)
    result["replica"] = replica
    result["checks"]["replica"] = {"passed": "error" not in replica}
    result["commands"] = {c.name: c.to_json() for c in commands}
    result["checks"].update(search_checks(out, commands))
    result["checks"]["validate"] = validation
    result["seconds"] = round(time.perf_counter() - started, 1)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    for line in summary(result):
        print(line)
    return 0 if all(c["passed"] for c in result["checks"].values()) else 1


def summary(result: dict) -> list[str]:
    """One line per check, then the wall time."""
    r, checks = result["replica"], result["checks"]
    lines = [f"replica: FAILED ({r['error']})" if "error" in r else _replica_line(r, result["mode"])]
    lines += [_search_line(dtype, checks[f"search-{dtype}"]) for dtype in ("bfloat16", "float32")]
    lines.append(_validate_line(checks["validate"]))
    lines.append(f"total wall time: {result['seconds']:.1f} s ({result['mode']} mode, {result['device']})")
    return lines


def _replica_line(r: dict, mode: str) -> str:
    est = r["estimate"]
    shape = "a 7B figure" if mode == "full" else "the formula only: a tiny shape"
    return (f"replica: {r['device']} {r['dtype']}, {r['parameters'] / 1e6:,.1f} M parameters, prompts of "
            f"{r['prompt_positions']}: prefill {r['prefill']['positions_per_s']:,.0f} positions/s, decode "
            f"{r['decode']['positions_per_s'] or 0:,.0f} positions/s ({r['decode']['rows']} rows, "
            f"{1000 * r['decode']['step_seconds']:.1f} ms a step), peak {_gib(r['prefill']['peak_bytes'])} / "
            f"{_gib(r['decode']['peak_bytes'])}; default 7B search {est['search_hours']['as lpes-tiny-kv']:.2f}-"
            f"{est['total_hours_at_bound']:.2f} GPU-hours ({shape})")


def _search_line(dtype: str, c: dict) -> str:
    if "rows" not in c:
        return f"search-{dtype}: FAILED ({c.get('why') or c.get('error')})"
    name, row = max(c["rows"].items(), key=lambda item: item[1]["differ"])
    itself = " (no GPU: the CPU run against itself)" if c["run"] == "search-cpu-float32" else ""
    return (f"search-{dtype}: {'passed' if c['passed'] else 'FAILED'}: decision {c['decision']} (CPU "
            f"{c['cpu_decision']}), same curve {c['same_curve']}, most differing row {name} {row['differ']}/"
            f"{row['prompts']} (allowed {row['allowed']}){itself}")


def _validate_line(v: dict) -> str:
    if "runs" not in v:
        return f"validate: FAILED ({v['error']})"
    parts = []
    for name, row in v["runs"].items():
        versus = (f"; reference vs CPU {row['reference_vs_cpu_differ']} allowed {row['reference_vs_cpu_allowed']}"
                  if "reference_vs_cpu_differ" in row else "")
        parts.append(f"{name} {row.get('verdict', 'missing')} (hf {row.get('hf_differ')}/{row.get('examples')} "
                     f"allowed {row.get('hf_allowed')}{versus})")
    return f"validate: {'passed' if v['passed'] else 'FAILED'}: " + "; ".join(parts)


def _gib(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**30:.2f} GiB"


if __name__ == "__main__":
    sys.exit(main())
