"""Latency of an LPES export against the same model exported unscaled and exported by optimum.

Three graphs of one random llama, run by onnxruntime's CPU provider:

- `lpes`: lpes's exporter with a curve-like LPES spec;
- `unscaled`: lpes's exporter with all scales 1 (the model's own RoPE);
- `optimum`: optimum-onnx's own exporter (`optimum-cli export onnx --task
  text-generation-with-past`), run as a subprocess in a second venv, because optimum-onnx
  needs transformers < 4.58 and lpes needs transformers 5 (`--optimum-venv`; `make compat`
  builds `.venv-compat`). Skipped, and said so, when that venv is missing.

The optimum graph has lpes's interface (optimum's names: input_ids, attention_mask,
position_ids, past_key_values.N.key/value -> logits, present.N.key/value), so the bench
writes an `lpes_onnx.json` describing it beside it and drives all graphs through the same
`OrtCausalLM.step` loop; before timing, its logits are checked against the unscaled lpes
graph (same weights, same RoPE), so the comparison is of one model.

One run = prefill of `--prefill` tokens + `--decode` greedy decode steps through the KV
cache (batch 1). Every round creates fresh sessions in a rotated order and alternates the
runs (with `--one-session`, each session runs its runs back to back, alone in memory), so
load on this shared machine hits all graphs alike; the ratios are of the median
run times, the spread is the range of the per-round ratios. Both wall time and the
thread's CPU time are reported (see `one_run`). `unscaled_again`, a second
session of the unscaled graph, is the noise floor.

    .venv/bin/python bench/bench_onnx_latency.py [--shape 8x512|1b] [--rounds 6] [--runs 5] [--threads 1]
        [--work DIR] [--reuse] [--graphs lpes,optimum] [--one-session] [--optimum-venv .venv-compat]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lpes.converter.loading import resolve_for_spec
from lpes.exporters.onnx import export as onnx_export
from lpes.exporters.onnx import graph_io as onnx_io
from lpes.exporters.onnx.export import export_onnx
from lpes.exporters.onnx.runner import OrtCausalLM
from lpes.foundation.spec import Spec

sys.path.insert(0, str(Path(__file__).parent))
# bench_onnx_memory imports nothing heavy at the top (it measures peak memory), so it holds the shared pieces.
from bench_onnx_memory import SHAPE as TINYLLAMA_SHAPE  # noqa: E402
from bench_onnx_memory import lpes_scales  # noqa: E402

SHAPES = {
    "8x512": {  # about 32 M parameters
        "vocab_size": 8000,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
    },
    "1b": TINYLLAMA_SHAPE,
}
DEFAULT_OPTIMUM_VENVS = (Path(".venv-compat"), Path("/tmp/venv-optimum"))


def build_model(folder: Path, shape: dict) -> int:
    """Save a random llama of `shape` into `folder`; returns its parameter count."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**shape))
    model.save_pretrained(folder)
    # transformers 4.x (optimum's) reads rope_theta at the top level, 5.x reads rope_parameters.
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return sum(p.numel() for p in model.parameters())


def _count_params(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as weights:
        return sum(int(np.prod(weights.get_slice(name).get_shape())) for name in weights.keys())


def find_optimum_venv(requested: Path | None) -> Path | None:
    for venv in [requested] if requested else DEFAULT_OPTIMUM_VENVS:
        if (venv / "bin" / "optimum-cli").is_file():
            return venv
    return None


def export_optimum(venv: Path, model_dir: Path, out_dir: Path, shape: dict) -> dict:
    """optimum-cli's export of `model_dir` into `out_dir`, plus the lpes_onnx.json that lets OrtCausalLM drive it."""
    start = time.perf_counter()
    command = [str(venv / "bin" / "optimum-cli"), "export", "onnx", "--model", str(model_dir),
               "--task", "text-generation-with-past", str(out_dir)]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    seconds = time.perf_counter() - start
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('optimum-onnx'), m.version('transformers'))"],
        check=True, capture_output=True, text=True).stdout.split()
    from transformers import LlamaConfig

    cache = onnx_io.CacheShape.from_config(LlamaConfig(**shape))
    metadata = {"format": "optimum-onnx (described for lpes's runner)", "dtype": "float32", **cache.to_json()}
    (out_dir / onnx_export.METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return {"export_seconds": round(seconds, 1), "optimum_onnx": versions[0], "transformers": versions[1],
            "command": " ".join(command[1:])}


def logits_difference(folders: list[Path], prompt: list[int], threads: int) -> float:
    """max |logit difference| between two graphs over a prefill then one decode step (one session at a time)."""
    ids = np.array([prompt[:64]], dtype=np.int64)
    positions = np.arange(ids.shape[1], dtype=np.int64)[None]
    outs = []
    for folder in folders:
        lm = OrtCausalLM(folder, "cpu", threads=threads)
        logits, cache = lm.step(ids, np.ones_like(ids), positions, lm.empty_past(1))
        token = logits[:, -1].argmax(-1)[:, None]
        step, _ = lm.step(token, np.ones((1, ids.shape[1] + 1), np.int64), positions[:, -1:] + 1, cache)
        outs.append(np.concatenate([logits[0], step[0]]))
        del lm, cache
    return float(np.abs(outs[0] - outs[1]).max())


def one_run(lm: OrtCausalLM, prompt: list[int], decode_steps: int) -> tuple[float, float, float, float]:
    """Seconds for the prefill and for the decode steps of one greedy generation (as OrtCausalLM.greedy).

    (prefill wall, decode wall, prefill CPU, decode CPU). With one onnxruntime thread the kernels
    run on this thread, so its CPU time counts the work alone: on a shared machine it leaves out
    the time the thread waited for a core, which wall time does not.
    """
    ids = np.array([prompt], dtype=np.int64)
    mask = np.ones_like(ids)
    positions = np.arange(len(prompt), dtype=np.int64)[None]
    wall, cpu = time.perf_counter(), time.thread_time()
    logits, cache = lm.step(ids, mask, positions, lm.empty_past(1))
    prefill_wall, prefill_cpu = time.perf_counter() - wall, time.thread_time() - cpu
    wall, cpu = time.perf_counter(), time.thread_time()
    for step in range(decode_steps):
        token = logits[:, -1].argmax(-1)[:, None]
        mask = np.ones((1, len(prompt) + step + 1), dtype=np.int64)
        logits, cache = lm.step(token, mask, positions[:, -1:] + step + 1, cache)
    return prefill_wall, time.perf_counter() - wall, prefill_cpu, time.thread_time() - cpu


def _rotate(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def _node_counts(folder: Path) -> dict:
    """Nodes in the file and after onnxruntime's own optimisations (what a session runs)."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        # Weights beside the graph: a 1 B model's do not fit in one protobuf.
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        options.log_severity_level = 3
        ort.InferenceSession(str(folder / onnx_export.MODEL_FILE), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node
    graph = onnx.load(folder / onnx_export.MODEL_FILE, load_external_data=False).graph.node
    return {"file": len(graph), "session": len(optimized),
            "SimplifiedLayerNormalization": sum(n.op_type == "SimplifiedLayerNormalization" for n in optimized)}


def export_all(args, work: Path, shape: dict) -> dict:
    model_dir = work / "model"
    folders = {"lpes": work / "lpes", "unscaled": work / "unscaled"}
    info: dict = {}
    reuse = args.reuse and all((f / "model.onnx").is_file() for f in folders.values())
    if not reuse:
        build_model(model_dir, shape)
        start = time.perf_counter()
        layers = shape["num_hidden_layers"]
        export_onnx(resolve_for_spec(model_dir, Spec.from_scales(lpes_scales(layers))), folders["lpes"])
        info["lpes_export_seconds"] = round(time.perf_counter() - start, 1)
        export_onnx(resolve_for_spec(model_dir, Spec.from_scales([1.0] * layers)), folders["unscaled"])
    venv = find_optimum_venv(args.optimum_venv)
    if venv is None:
        print(f"optimum skipped: no optimum-cli in {args.optimum_venv or ' or '.join(map(str, DEFAULT_OPTIMUM_VENVS))}")
    else:
        folders["optimum"] = work / "optimum"
        if not (reuse and (folders["optimum"] / "model.onnx").is_file()):
            info["optimum"] = export_optimum(venv, model_dir, folders["optimum"], shape)
    info["folders"] = folders
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="8x512")
    parser.add_argument("--rounds", type=int, default=6, help="fresh sessions per round")
    parser.add_argument("--runs", type=int, default=5, help="runs of each graph per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--work", type=Path, default=None, help="keep the model and exports here")
    parser.add_argument("--reuse", action="store_true", help="reuse the exports already in --work")
    parser.add_argument("--graphs", default=None,
                        help="time only these (comma-separated: lpes,unscaled,optimum,unscaled_again; default all)")
    parser.add_argument("--one-session", action="store_true",
                        help="one session in memory at a time, its runs back to back (for --shape 1b: 4.4 GB each)")
    venvs = " or ".join(map(str, DEFAULT_OPTIMUM_VENVS))
    parser.add_argument("--optimum-venv", type=Path, default=None, help=f"venv with optimum-onnx (default: {venvs})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    work = args.work or Path(tempfile.mkdtemp(prefix="lpes-bench-latency-"))

    info = export_all(args, work, shape)
    folders = {**info.pop("folders")}
    folders["unscaled_again"] = folders["unscaled"]
    prompt = np.random.default_rng(0).integers(4, shape["vocab_size"], args.prefill).tolist()
    if "optimum" in folders:
        pair = [folders["unscaled"], folders["optimum"]]
        info["optimum_vs_unscaled_max_logit_difference"] = logits_difference(pair, prompt, args.threads)
    if args.graphs:
        folders = {name: folders[name] for name in args.graphs.split(",") if name in folders}

    times: dict[str, list[list[tuple[float, ...]]]] = {name: [] for name in folders}
    for round_ in range(args.rounds):
        # Which session is created first changes its speed by a few percent (memory placement), as
        # the unscaled_again control shows: rotate creation and run order every round.
        names = _rotate(list(folders), round_)
        for name in names:
            times[name].append([])
        if args.one_session:
            for name in names:
                _time_alone(folders[name], prompt, args, times[name][-1])
            continue
        runners = {name: OrtCausalLM(folders[name], "cpu", threads=args.threads) for name in names}
        for lm in runners.values():  # warm-up: the first runs allocate arenas
            one_run(lm, prompt, args.decode)
        for i in range(args.runs):
            for name in _rotate(names, i):
                times[name][-1].append(one_run(runners[name], prompt, args.decode))
        del runners
    print(json.dumps(summarise(args, shape, work, info, folders, times), indent=2))


def _time_alone(folder: Path, prompt: list[int], args, into: list) -> None:
    """--one-session: this graph's session alone in memory, its runs back to back."""
    lm = OrtCausalLM(folder, "cpu", threads=args.threads)
    one_run(lm, prompt, args.decode)  # warm-up
    into.extend(one_run(lm, prompt, args.decode) for _ in range(args.runs))
    del lm


def summarise(args, shape: dict, work: Path, info: dict, folders: dict, times: dict) -> dict:
    # Indices into one_run's tuple: wall time, then the thread's CPU time.
    parts = {"total": (0, 1), "prefill": (0,), "decode": (1,)}
    cpu_parts = {"total": (2, 3), "prefill": (2,), "decode": (3,)}

    def seconds(run: tuple[float, ...], part: tuple[int, ...]) -> float:
        return sum(run[i] for i in part)

    def median(name: str, part: tuple[int, ...], round_: int | None = None) -> float:
        rounds = times[name] if round_ is None else [times[name][round_]]
        return statistics.median(seconds(run, part) for runs in rounds for run in runs)

    def ratio(name: str, base: str, part: tuple[int, ...]) -> dict:
        per_round = [median(name, part, r) / median(base, part, r) for r in range(args.rounds)]
        return {"median": round(median(name, part) / median(base, part), 4),
                "per_round_min": round(min(per_round), 4), "per_round_max": round(max(per_round), 4)}

    pairs = [("lpes", "unscaled"), ("unscaled_again", "unscaled"), ("lpes", "optimum"), ("unscaled", "optimum")]
    pairs = [(a, b) for a, b in pairs if a in folders and b in folders]
    return {
        "shape": args.shape,
        "params": _count_params(work / "model"),
        "threads": args.threads,
        "rounds_x_runs": f"{args.rounds} x {args.runs}",
        "prefill_tokens": args.prefill,
        "decode_steps": args.decode,
        **info,
        "nodes": {name: _node_counts(folder) for name, folder in folders.items() if name != "unscaled_again"},
        "median_wall_s": {name: {p: round(median(name, i), 4) for p, i in parts.items()} for name in folders},
        "median_cpu_s": {name: {p: round(median(name, i), 4) for p, i in cpu_parts.items()} for name in folders},
        "ratios_wall": {f"{a}/{b}": {p: ratio(a, b, i) for p, i in parts.items()} for a, b in pairs},
        "ratios_cpu": {f"{a}/{b}": {p: ratio(a, b, i) for p, i in cpu_parts.items()} for a, b in pairs},
    }


if __name__ == "__main__":
    main()
