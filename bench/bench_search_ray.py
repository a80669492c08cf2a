"""Scoring on Ray replicas: tokens/s for 1 and 2 CPU replicas in one run, the racing cost per replica count,
and from both an estimate of a 7B search on 1 / 4 / 16 GPUs.

    python bench/bench_search_ray.py [--examples 4] [--population 16] [--generations 6]

1. Throughput: one local Ray cluster (all CPUs of this machine); the same workload (every
   uniform scale vector of 1:4:1 on every calibration example, cut into the chunks lpes-search
   sends: one batch of 8 per replica) scored by 1 and then 2 CPU actors, each with its share
   of the CPUs as torch threads; then by one replica in this process, for reference. Prints
   tokens/s in total and per replica, and checks every verdict agrees.
2. Racing cost per replica count: with N replicas lpes-search races N genomes at once, each
   its own chunk (one example first, doubling to a batch of 8); it used to cut one genome's
   chunk into N shares, which let hopeless genomes run longer. The search is replayed for
   N = 1, 2, 4, 16 with verdicts memoized (each (scales, example) scored once, by the Ray
   actors), counting the tokens N replicas would compute; the curve must not change.
   (bench/bench_search.py replays it too, at the defaults, for both optimizers.)
3. The estimate: formulas and assumptions printed with the numbers (see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

from lpes.converter.loading import load_config, load_tokenizer, resolve_model
from lpes.search.fitness import ModelEvaluator
from lpes.search.ga import GeneticSearch
from lpes.search.genome import ScaleGrid, SearchSpace
from lpes.search.replicas import open_pool
from lpes.search.run import SearchOptions, check_options
from lpes.validation import scoring
from lpes.validation.tasks import examples_for, task_config

MODEL = "lpes-tiny-kv"
BATCH = 8
RESEARCH_HOURS, RESEARCH_GPUS = 34.0, 4  # Vicuna-7B, population 32, 20 generations, one evaluator per GPU


def throughput(pool, examples: list, workload: list[tuple[float, ...]], threads: int) -> dict:
    """Score `workload` on every example in lpes-search's chunks; tokens/s, busy shares, per-call overhead."""
    evaluator = ModelEvaluator(pool, len(examples))
    calls: list[tuple[float, float]] = []  # (wall of a call, longest replica time in it)
    score = pool.score

    def timed(scales, shares):
        started = time.perf_counter()
        results = score(scales, shares)
        calls.append((time.perf_counter() - started, max(r.busy_s for r in results)))
        return results

    pool.score = timed
    ids = list(range(len(examples)))
    chunk = BATCH * pool.size
    evaluator.correct(workload[0], ids[:pool.size])  # warm-up: first call of each replica
    calls.clear()
    tokens_before = evaluator.forward_tokens
    usage_before = [(u.busy_s, u.forward_tokens) for u in evaluator.usage]
    started = time.perf_counter()
    verdicts = [ok for scales in workload for k in range(0, len(ids), chunk)
                for ok in evaluator.correct(scales, ids[k:k + chunk])]  # in (scales, example) order
    wall = time.perf_counter() - started
    pool.score = score
    tokens = evaluator.forward_tokens - tokens_before
    per_replica = [(u.forward_tokens - t0) / wall for u, (_, t0) in zip(evaluator.usage, usage_before)]
    busy = [(u.busy_s - b0) / wall for u, (b0, _) in zip(evaluator.usage, usage_before)]
    overhead_ms = 1000 * sum(w - b for w, b in calls) / len(calls)
    return {"backend": pool.layout["backend"], "replicas": pool.size, "threads": threads, "tokens": tokens,
            "seconds": round(wall, 2), "tokens_per_s": round(tokens / wall),
            "per_replica_tokens_per_s": [round(r) for r in per_replica], "busy": [round(b, 3) for b in busy],
            "calls": len(calls), "overhead_ms_per_call": round(overhead_ms, 1), "verdicts": verdicts}


class MemoEvaluator:
    """Verdicts from a pool, each (scales, example) scored once; counts the tokens N replicas would compute."""

    def __init__(self, pool, row_tokens: list[int]):
        self.pool, self.row_tokens = pool, row_tokens
        self.num_examples, self.forward_tokens = len(row_tokens), 0
        self.cache: dict[tuple, bool] = {}

    def correct(self, scales: tuple[float, ...], example_ids: list[int]) -> list[bool]:
        missing = [i for i in example_ids if (scales, i) not in self.cache]
        if missing:
            shares = [s for s in (missing[k::self.pool.size] for k in range(self.pool.size)) if s]
            for result in self.pool.score(scales, shares):
                self.cache.update({(scales, i): ok for i, ok in zip(result.example_ids, result.verdicts)})
        # Equal-length prompts: a replica's batch has no padding, so its tokens are the rows' own.
        self.forward_tokens += sum(self.row_tokens[i] for i in example_ids)
        return [self.cache[(scales, i)] for i in example_ids]


def racing_cost(pool, examples, tokenizer, options: SearchOptions, counts: list[int]) -> list[dict]:
    grid, settings = check_options(options)
    space = SearchSpace(grid, load_config(resolve_model(MODEL)).num_hidden_layers, options.degree)
    memo = MemoEvaluator(pool, [len(e.prompt_ids) + len(e.answer_ids) - 1
                                for e in scoring.encode_examples(tokenizer, examples)])
    rows = []
    for n in counts:
        memo.forward_tokens = 0
        state = GeneticSearch(space, memo, replace(settings, chunk=BATCH, first_chunk=1, replicas=n)).run()
        best = state.parents[0]
        rows.append({"replicas": n, "tokens": memo.forward_tokens, "evaluations": state.evaluations,
                     "raced_out": state.raced_out, "fitness": best.fitness,
                     "scales": list(space.scales_key(best.genome)), "history": [h["best"] for h in state.history]})
    full = (state.evaluations + state.raced_out) * sum(memo.row_tokens)  # every genome on every example
    for row in rows:
        row["vs_no_racing"] = round(row["tokens"] / full, 3)
    return rows


def estimate(racing: list[dict], tokens_ratio_1: float, efficiency: float) -> list[dict]:
    """Hours of a 7B search on G GPUs, scaled from the research implementation's 34 h on 4 GPUs."""
    gpu_hours = RESEARCH_HOURS * RESEARCH_GPUS
    base = racing[0]["tokens"]
    rows = []
    for row in racing:
        coarser = row["tokens"] / base  # more replicas: coarser racing chunks, more tokens
        hours = gpu_hours * tokens_ratio_1 * coarser / (row["replicas"] * efficiency)
        rows.append({"gpus": row["replicas"], "token_factor": round(coarser, 3), "hours": round(hours, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=4, help="calibration examples per gold index (5 indices)")
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--counts", default="1,2,4,16", help="replica counts for the racing cost")
    # Measured by bench/bench_search.py at the defaults (bench/RESULTS.md): lpes / plain GA tokens.
    parser.add_argument("--tokens-ratio", type=float, default=13_247_488 / 35_020_800,
                        help="lpes tokens / plain-GA tokens at population 32, 20 generations (default: gentle ties)")
    parser.add_argument("--efficiency", type=float, default=0.9,
                        help="assumed data-parallel efficiency of GPU replicas (see RESULTS.md)")
    args = parser.parse_args()

    import ray
    import torch

    path = resolve_model(MODEL)
    tokenizer = load_tokenizer(path)
    data = f"tiny-kv:examples={args.examples}"
    examples = examples_for(task_config(path, data), path, use_chat_template=True, split="search")
    workload = [(s,) * 4 for s in ScaleGrid.parse("1:4:1").values]
    cpus = os.cpu_count() or 1
    common = dict(method="teacher-forced", batch_size=BATCH, dtype="float32", device="cpu")
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    results, racing = [], []
    # A replica on one CPU first (a cluster of 1 CPU), then the whole machine: 1 replica with every
    # thread, 2 replicas with half each; data-parallel scaling is 2 x 1 thread against 1 x 1 thread.
    for cluster_cpus, counts in ((1, [1]), (cpus, [1, 2])):
        ray.init(num_cpus=cluster_cpus, **quiet)
        try:
            for n in counts:
                pool = open_pool(path, tokenizer, examples, ray="auto", replicas=n, **common)
                try:
                    results.append(throughput(pool, examples, workload, cluster_cpus // n))
                finally:
                    pool.close()
            if cluster_cpus == cpus:
                pool = open_pool(path, tokenizer, examples, ray="auto", replicas=min(2, cpus), **common)
                try:
                    options = SearchOptions(data=data, population=args.population, generations=args.generations,
                                            scale_grid="1:4:0.25")  # the default grid when it was measured
                    racing = racing_cost(pool, examples, tokenizer, options, [int(c) for c in args.counts.split(",")])
                finally:
                    pool.close()
        finally:
            ray.shutdown()
    pool = open_pool(path, tokenizer, examples, **common)  # this process, torch's default threads
    results.append(throughput(pool, examples, workload, torch.get_num_threads()))
    pool.close()
    same = all(r["verdicts"] == results[0]["verdicts"] for r in results)
    for r in results:
        r.pop("verdicts")
    print(json.dumps({"throughput": results, "racing": racing}, indent=1))
    print(f"\n{len(examples)} calibration examples ({data}), {len(workload)} scale vectors, {cpus} CPUs "
          f"(load average {os.getloadavg()[0]:.1f} at the end); "
          f"same verdicts everywhere: {same}\n")
    print("| scoring | replicas x threads | tokens | seconds | tokens/s | tokens/s per replica | busy "
          "| overhead per call (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['backend']} | {r['replicas']} x {r['threads']} | {r['tokens']:,} | {r['seconds']} "
              f"| {r['tokens_per_s']:,} | {' / '.join(map(str, r['per_replica_tokens_per_s']))} "
              f"| {' / '.join(f'{b:.0%}' for b in r['busy'])} | {r['overhead_ms_per_call']} |")
    print(f"\nracing cost per replica count (population {args.population}, {args.generations} generations):\n")
    print("| replicas | tokens | vs no racing | scored in full | raced out | fitness | same curve as 1 |")
    print("|---|---|---|---|---|---|---|")
    for row in racing:
        print(f"| {row['replicas']} | {row['tokens']:,} | {row['vs_no_racing']:.2f} | {row['evaluations']} "
              f"| {row['raced_out']} | {row['fitness']:.3f} | {row['scales'] == racing[0]['scales']} |")
    print(f"\n7B estimate: {RESEARCH_HOURS:g} h x {RESEARCH_GPUS} GPUs x tokens ratio {args.tokens_ratio:.3f} "
          f"x token factor(G) / (G x efficiency {args.efficiency}):\n")
    print("| GPUs | token factor | hours |")
    print("|---|---|---|")
    for row in estimate(racing, args.tokens_ratio, args.efficiency):
        print(f"| {row['gpus']} | {row['token_factor']} | {row['hours']} |")


if __name__ == "__main__":
    main()
