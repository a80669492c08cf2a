"""The search runner's cache and attention (validation/cache_and_attention.py) against transformers' own, runs
interleaved on the same batches of a real model's task (the machine's drift falls on both alike).

    OMP_NUM_THREADS=2 python bench/bench_cache_and_attention.py [--model smollm2-135m] [--split held-out|calibration]
        [--prompts 32] [--repeats 3]

held-out: one batch of all the prompts, prefilled in chunks as `Replica.greedy_verdicts` does; calibration: batches
of 8 in the data's order, as racing's chunks. Each run is `SharedPrefixGreedy` at s = 1 with an empty draft pool,
once with transformers' `DynamicCache` and sdpa attention, once with `GrowingLayer` and `grouped_sdpa`. Prints each
run's seconds, the median of each, and whether every answer is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from transformers import DynamicCache

from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.search.plan import _held_out_examples, _held_out_task
from lpes.validation import cache_and_attention
from lpes.validation.scoring import MAX_BATCH_TOKENS, encode_examples, eos_token_ids, pad_token_id
from lpes.validation.shared_greedy import DraftPool, SharedPrefixGreedy
from lpes.validation.tasks import examples_for, task_config

OURS = cache_and_attention.growing_cache, cache_and_attention.grouped_attention
THEIRS = (lambda layers=None: DynamicCache() if layers is None else DynamicCache(layers),
          lambda model: contextlib.nullcontext())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--split", choices=["held-out", "calibration"], default="held-out")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = resolve_model(args.model)
    model, tokenizer, task = load_model(path, "float32").eval(), load_tokenizer(path), task_config(path, None)
    if args.split == "held-out":
        data = examples_for(_held_out_task(task, args.prompts), path, use_chat_template=True, split="validation")
        examples, batch, prefill = _held_out_examples(data, args.prompts), args.prompts, MAX_BATCH_TOKENS // 2
    else:
        examples = examples_for(task, path, use_chat_template=True, split="search")[: args.prompts]
        batch, prefill = 8, None
    prompts = [e.prompt_ids for e in encode_examples(tokenizer, examples)]
    budget, eos, pad = examples[0].answer_tokens, eos_token_ids(model, tokenizer), pad_token_id(model, tokenizer)
    print(f"{args.model}, {args.split}: {len(prompts)} prompts of {max(map(len, prompts))} tokens, batches of "
          f"{batch}, answers of up to {budget} tokens, {torch.get_num_threads()} threads")
    seconds, answers = {"transformers": [], "lpes": []}, {}
    for _ in range(args.repeats):
        for name, (cache, attention) in (("transformers", THEIRS), ("lpes", OURS)):
            cache_and_attention.growing_cache, cache_and_attention.grouped_attention = cache, attention
            runner = SharedPrefixGreedy(model, pad, prefill, DraftPool())
            started = time.perf_counter()
            answers[name] = [a for i in range(0, len(prompts), batch)
                             for a in runner.greedy(prompts[i: i + batch], budget, eos)]
            seconds[name].append(time.perf_counter() - started)
            print(f"{name}: {seconds[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(runs) for name, runs in seconds.items()}
    print(f"median: transformers {medians['transformers']:.2f} s, lpes {medians['lpes']:.2f} s "
          f"({medians['lpes'] / medians['transformers'] - 1:+.0%}); the same answers: "
          f"{answers['lpes'] == answers['transformers']}")


if __name__ == "__main__":
    main()
