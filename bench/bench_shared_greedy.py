"""The search's greedy runner (validation/shared_greedy.py) against transformers' `generate` (TorchGreedy), side by
side on the same batches of a real model's own task, candidate after candidate as a search meets them.

    OMP_NUM_THREADS=2 python bench/bench_shared_greedy.py [--model smollm2-135m] [--split held-out|calibration]
        [--prompts 64] [--scales 1.0,0.75,0.8]

held-out: batches of 32 prompts taken as the decision takes them (each example at its gold positions in turn),
prefilled in chunks as `Replica.greedy_verdicts` does; calibration: batches of 8 in the data's order (one gold
position a batch), as racing's chunks. Every candidate (a uniform scale) runs `generate` first, then the shared
runner, whose pool holds every earlier candidate's answers. Prints seconds per prompt for each and whether every
answer (up to its end token) is the same.
"""

from __future__ import annotations

import argparse
import time

import torch

from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.converter.reference import apply
from lpes.exporters.runners import TorchGreedy
from lpes.foundation.spec import Spec
from lpes.search.plan import _held_out_examples, _held_out_task
from lpes.search.replica import WIDE_BATCHES
from lpes.validation.scoring import MAX_BATCH_TOKENS, encode_examples, eos_token_ids, pad_token_id
from lpes.validation.shared_greedy import DraftPool, SharedPrefixGreedy
from lpes.validation.tasks import examples_for, task_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--split", choices=["held-out", "calibration"], default="held-out")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--scales", default="1.0,0.75,0.8")
    args = parser.parse_args()
    path = resolve_model(args.model)
    model, tokenizer, task = load_model(path, "float32").eval(), load_tokenizer(path), task_config(path, None)
    if args.split == "held-out":
        data = examples_for(_held_out_task(task, args.prompts), path, use_chat_template=True, split="validation")
        examples, batch, prefill = _held_out_examples(data, args.prompts), 8 * WIDE_BATCHES, MAX_BATCH_TOKENS // 2
    else:
        examples = examples_for(task, path, use_chat_template=True, split="search")[: args.prompts]
        batch, prefill = 8, None
    prompts = [e.prompt_ids for e in encode_examples(tokenizer, examples)]
    budget, eos, pad = examples[0].answer_tokens, eos_token_ids(model, tokenizer), pad_token_id(model, tokenizer)
    plain, shared = TorchGreedy(model, pad, prefill), SharedPrefixGreedy(model, pad, prefill, DraftPool())
    print(f"{args.model}, {args.split}: {len(prompts)} prompts of {max(map(len, prompts))} tokens, batches of "
          f"{batch}, answers of up to {budget} tokens, {torch.get_num_threads()} threads")
    for scale in (float(s) for s in args.scales.split(",")):
        apply(model, Spec.from_scales([scale] * model.config.num_hidden_layers))
        (expected, generate_s), (answers, shared_s) = (_timed(r, prompts, batch, budget, eos) for r in (plain, shared))
        same = sum(_until(a, eos) == _until(b, eos) for a, b in zip(expected, answers))
        per_prompt = generate_s / len(prompts), shared_s / len(prompts)
        print(f"s = {scale:g}: generate {per_prompt[0]:.3f} s a prompt, shared {per_prompt[1]:.3f} "
              f"({shared_s / generate_s - 1:+.0%}); the same answer on {same}/{len(prompts)}", flush=True)


def _timed(runner, prompts: list[list[int]], batch: int, budget: int, eos: list[int]) -> tuple[list, float]:
    started, answers = time.perf_counter(), []
    for start in range(0, len(prompts), batch):
        answers += runner.greedy(prompts[start: start + batch], budget, eos)
    return answers, time.perf_counter() - started


def _until(tokens: list[int], eos: list[int]) -> list[int]:
    """`generate` pads a finished row with the pad token (often the end token): compare up to the first end."""
    for n, token in enumerate(tokens):
        if token in eos:
            return tokens[: n + 1]
    return tokens


if __name__ == "__main__":
    main()
