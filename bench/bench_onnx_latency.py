"""No inference cost, measured: onnxruntime CPU latency of an LPES export vs the same model exported unscaled.

Both graphs come out of the same exporter from the same random llama (about 34 M
parameters); the unscaled one uses a spec of all ones, which leaves the model's own
RoPE untouched. One run = prefill of 256 tokens + 32 greedy decode steps through the
KV cache (batch 1). Runs alternate LPES / unscaled so that load on the machine hits
both alike; the result is the ratio of the median run times (target <= 1.02).

    .venv/bin/python bench/bench_onnx_latency.py [--runs 15] [--threads 1] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lpes.exporters.onnx_export import export_onnx
from lpes.spec import Spec
from lpes.validation.ort_runner import OrtCausalLM

SHAPE = {
    "vocab_size": 8000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
# A curve-like spec: strong interpolation in the first layers, none in the last ones.
LPES_SCALES = [4.0, 3.2, 2.5, 1.9, 1.4, 1.1, 1.0, 1.0]


def build_model(folder: Path) -> int:
    """Save a random llama of SHAPE into `folder`; returns its parameter count."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE))
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def _count_params(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as weights:
        return sum(int(np.prod(weights.get_slice(name).get_shape())) for name in weights.keys())


def one_run(lm: OrtCausalLM, prompt: list[int], decode_steps: int) -> tuple[float, float]:
    """Seconds for the prefill and for the decode steps of one greedy generation (as OrtCausalLM.greedy)."""
    ids = np.array([prompt], dtype=np.int64)
    mask = np.ones_like(ids)
    positions = np.arange(len(prompt), dtype=np.int64)[None]
    start = time.perf_counter()
    outputs = lm._run(ids, mask, positions, lm.empty_past(1))
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(decode_steps):
        token = outputs[0].numpy()[:, -1].argmax(-1)[:, None]
        mask = np.ones((1, len(prompt) + step + 1), dtype=np.int64)
        outputs = lm._run(token, mask, positions[:, -1:] + step + 1, outputs[1:])
    return prefill, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--work", type=Path, default=None, help="keep the model and exports here")
    parser.add_argument("--reuse", action="store_true", help="reuse the exports already in --work")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="lpes-bench-latency-"))

    model_dir, lpes_dir, plain_dir = work / "model", work / "lpes", work / "unscaled"
    export_s = None
    if not (args.reuse and (lpes_dir / "model.onnx").is_file() and (plain_dir / "model.onnx").is_file()):
        build_model(model_dir)
        start = time.perf_counter()
        export_onnx(model_dir, Spec.from_scales(LPES_SCALES), lpes_dir)
        export_s = round(time.perf_counter() - start, 1)
        export_onnx(model_dir, Spec.from_scales([1.0] * len(LPES_SCALES)), plain_dir)
    params = _count_params(model_dir)

    runners = {
        "lpes": OrtCausalLM(lpes_dir, "cpu", threads=args.threads),
        "unscaled": OrtCausalLM(plain_dir, "cpu", threads=args.threads),
    }
    prompt = np.random.default_rng(0).integers(4, SHAPE["vocab_size"], args.prefill).tolist()
    for lm in runners.values():  # warm-up: first runs allocate arenas
        one_run(lm, prompt, args.decode)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    for i in range(args.runs):
        order = ("lpes", "unscaled") if i % 2 == 0 else ("unscaled", "lpes")
        for name in order:
            times[name].append(one_run(runners[name], prompt, args.decode))

    def median(name: str, part: int | None) -> float:
        return statistics.median(sum(t) if part is None else t[part] for t in times[name])

    result = {
        "params": params,
        "threads": args.threads,
        "runs": args.runs,
        "prefill_tokens": args.prefill,
        "decode_steps": args.decode,
        "export_seconds": export_s,
        "median_total_s": {name: round(median(name, None), 4) for name in runners},
        "median_prefill_s": {name: round(median(name, 0), 4) for name in runners},
        "median_decode_s": {name: round(median(name, 1), 4) for name in runners},
        "ratio_total": round(median("lpes", None) / median("unscaled", None), 4),
        "ratio_prefill": round(median("lpes", 0) / median("unscaled", 0), 4),
        "ratio_decode": round(median("lpes", 1) / median("unscaled", 1), 4),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
