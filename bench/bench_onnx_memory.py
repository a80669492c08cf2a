"""Peak memory of exporting a random ~1 B-parameter llama to ONNX, as a multiple of its weight bytes.

Three steps, each in its own process so that one's memory does not count for the next:

1. `build`: a random llama shaped like TinyLlama-1.1B, saved with save_pretrained;
2. `export`: export_onnx with an LPES spec; the child reports its peak resident set
   size (ru_maxrss) and the time taken;
3. `check`: one prefill + 8 greedy tokens in onnxruntime, peak RSS recorded too.

    nohup .venv/bin/python bench/bench_onnx_memory.py --work /tmp/lpes-1b > /tmp/lpes-1b.log 2>&1 &

Needs about 3x the weight bytes of free disk in --work (model, export) and, for float32,
roughly 4.4 GB of weights.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SHAPE = {  # TinyLlama-1.1B's shape
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}


def lpes_scales(num_layers: int) -> list[float]:
    """A curve-like spec: 4.0 at the first layer down to 1.0 at the last, all distinct (one constant per layer)."""
    return [1.0 + 3.0 * (1 - h / (num_layers - 1)) ** 2 for h in range(num_layers)]


def build(work: Path, dtype: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lpes.converter.loading import torch_dtype

    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE), dtype=torch_dtype(dtype))
    model.save_pretrained(work / "model")
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def export(work: Path, dtype: str) -> dict:
    import torch

    from lpes.converter.loading import resolve_for_spec
    from lpes.exporters.onnx.export import export_onnx
    from lpes.foundation.spec import Spec

    torch.set_num_threads(2)
    scales = lpes_scales(SHAPE["num_hidden_layers"])
    start = time.perf_counter()
    export_onnx(resolve_for_spec(work / "model", Spec.from_scales(scales)), work / "onnx", dtype=dtype)
    return {"export_seconds": round(time.perf_counter() - start, 1)}


def check(work: Path, dtype: str) -> dict:
    from lpes.exporters.onnx.runner import OrtCausalLM

    start = time.perf_counter()
    lm = OrtCausalLM(work / "onnx", "cpu", threads=2)
    tokens = lm.greedy([list(range(100, 164))], 8)
    return {"onnxruntime_seconds": round(time.perf_counter() - start, 1), "tokens": tokens[0]}


STEPS = {"build": build, "export": export, "check": check}


def run_step(step: str, work: Path, dtype: str) -> dict:
    """Run one step in a child process; its result plus its own peak RSS."""
    out = subprocess.run(
        [sys.executable, __file__, "--step", step, "--work", str(work), "--dtype", dtype],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--step", choices=sorted(STEPS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:  # child: do one step, print its result and peak RSS as the last line
        result = STEPS[args.step](args.work, args.dtype)
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps(result))
        return

    args.work.mkdir(parents=True, exist_ok=True)
    results = {step: run_step(step, args.work, args.dtype) for step in STEPS}
    weights = results["build"]["weight_bytes"]
    onnx_files = sorted(p.name for p in (args.work / "onnx").iterdir())
    summary = {
        "dtype": args.dtype,
        "params": results["build"]["params"],
        "weight_gb": round(weights / 1e9, 2),
        "export_seconds": results["export"]["export_seconds"],
        "export_peak_rss_gb": round(results["export"]["peak_rss_bytes"] / 1e9, 2),
        "export_peak_rss_x_weights": round(results["export"]["peak_rss_bytes"] / weights, 2),
        "onnxruntime_peak_rss_x_weights": round(results["check"]["peak_rss_bytes"] / weights, 2),
        "onnx_files": onnx_files,
        "onnx_data_gb": round(sum(p.stat().st_size for p in (args.work / "onnx").iterdir()) / 1e9, 2),
        "greedy_tokens": results["check"]["tokens"],
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
