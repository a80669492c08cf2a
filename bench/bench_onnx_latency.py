"""No inference cost, measured: onnxruntime CPU latency of an LPES export vs the same model exported unscaled.

Both graphs come out of the same exporter from the same random llama (about 32 M
parameters); the unscaled one uses a spec of all ones, which leaves the model's own
RoPE untouched. One run = prefill of 256 tokens + 32 greedy decode steps through the
KV cache (batch 1). Runs alternate so that load on the machine hits all graphs alike;
the result is the ratio of the median run times (target <= 1.02). A third session of
the unscaled graph is timed too: its ratio to the unscaled one is the noise floor.

    .venv/bin/python bench/bench_onnx_latency.py [--rounds 6] [--runs 5] [--threads 1] [--work DIR]
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
    logits, cache = lm.step(ids, mask, positions, lm.empty_past(1))
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(decode_steps):
        token = logits[:, -1].argmax(-1)[:, None]
        mask = np.ones((1, len(prompt) + step + 1), dtype=np.int64)
        logits, cache = lm.step(token, mask, positions[:, -1:] + step + 1, cache)
    return prefill, time.perf_counter() - start


def _rotate(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="fresh sessions per round")
    parser.add_argument("--runs", type=int, default=5, help="runs of each graph per round")
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

    prompt = np.random.default_rng(0).integers(4, SHAPE["vocab_size"], args.prefill).tolist()
    folders = {"lpes": lpes_dir, "unscaled": plain_dir, "unscaled_again": plain_dir}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in folders}
    for round_ in range(args.rounds):
        # Which session is created first changes its speed by a few percent (memory placement), as
        # the unscaled_again control shows: rotate creation and run order every round.
        names = _rotate(list(folders), round_)
        runners = {name: OrtCausalLM(folders[name], "cpu", threads=args.threads) for name in names}
        for lm in runners.values():  # warm-up: the first runs allocate arenas
            one_run(lm, prompt, args.decode)
        for i in range(args.runs):
            for name in _rotate(names, i):
                times[name].append(one_run(runners[name], prompt, args.decode))
        del runners

    def median(name: str, part: int | None) -> float:
        return statistics.median(sum(t) if part is None else t[part] for t in times[name])

    def ratio(name: str, part: int | None) -> float:
        return round(median(name, part) / median("unscaled", part), 4)

    result = {
        "params": params,
        "threads": args.threads,
        "rounds_x_runs": f"{args.rounds} x {args.runs}",
        "prefill_tokens": args.prefill,
        "decode_steps": args.decode,
        "export_seconds": export_s,
        "median_total_s": {name: round(median(name, None), 4) for name in folders},
        "median_prefill_s": {name: round(median(name, 0), 4) for name in folders},
        "median_decode_s": {name: round(median(name, 1), 4) for name in folders},
        "ratio_total": ratio("lpes", None),
        "ratio_prefill": ratio("lpes", 0),
        "ratio_decode": ratio("lpes", 1),
        "control_ratio_total": ratio("unscaled_again", None),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
