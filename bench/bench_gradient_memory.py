"""What one backward pass of `--optimizer gradient` costs: peak memory and time per prompt length.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_gradient_memory.py --models smollm2-135m,gemma3-270m --pairs 20,100

Each (model, pair count) runs in a process of its own (peak RSS is per process): the model's own
kv task at that many pairs, one prompt, batch 1; a forward pass without grad, then a forward and
backward pass through the differentiable per-layer scales (`reference.apply_differentiable`,
weights frozen), as one replica's `gradient` does. Prints a markdown row per run: prompt tokens,
forward seconds, forward+backward seconds, peak RSS after loading, after the forward, after the
backward, and the backward's extra memory per token.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(model_name: str, pairs: int) -> dict:
    import torch

    from lpes.converter.loading import load_model, load_tokenizer, resolve_model
    from lpes.converter.reference import apply_differentiable
    from lpes.validation.scoring import answer_logprob_batches, encode_examples
    from lpes.validation.tasks import examples_for, task_config

    path = resolve_model(model_name)
    model, tokenizer = load_model(path, "float32").requires_grad_(False), load_tokenizer(path)
    loaded = peak_rss_mb()
    [example] = examples_for(task_config(path, f"kv:pairs={pairs},examples=1,gold=0"), path, split="search")[:1]
    tokens = len(encode_examples(tokenizer, [example])[0].prompt_ids)
    started = time.perf_counter()
    list(answer_logprob_batches(model, tokenizer, [example], batches=[[0]]))
    forward_s, forward_mb = time.perf_counter() - started, peak_rss_mb()
    scales = torch.ones(model.config.num_hidden_layers, requires_grad=True)
    started = time.perf_counter()
    apply_differentiable(model, scales)
    [(rows, _)] = list(answer_logprob_batches(model, tokenizer, [example], grad=True, batches=[[0]]))
    rows[0].logprob.backward()
    backward_s, backward_mb = time.perf_counter() - started, peak_rss_mb()
    return {"model": model_name, "pairs": pairs, "tokens": tokens, "forward_s": round(forward_s, 2),
            "forward_backward_s": round(backward_s, 2), "loaded_mb": round(loaded), "forward_mb": round(forward_mb),
            "backward_mb": round(backward_mb),
            "backward_kb_per_token": round(1024 * (backward_mb - forward_mb) / tokens, 1),
            "gradient_at_1": [round(float(g), 5) for g in scales.grad]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--pairs", default="20,100")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "PAIRS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]))))
        return 0
    print("| model | pairs | prompt tokens | forward s | forward+backward s | RSS loaded MB | after forward | "
          "after backward | backward KB/token |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in args.models.split(","):
        for pairs in args.pairs.split(","):
            out = subprocess.run([sys.executable, __file__, "--one", model, pairs], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            print(f"| {r['model']} | {r['pairs']} | {r['tokens']} | {r['forward_s']} | {r['forward_backward_s']} | "
                  f"{r['loaded_mb']} | {r['forward_mb']} | {r['backward_mb']} | {r['backward_kb_per_token']} |",
                  flush=True)
            print(json.dumps(r), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
