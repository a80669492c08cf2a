"""Search cost, side by side: the papers' plain GA, lpes-search's GA and CMA-ES, on both bundled models,
and the racing cost per replica count.

    python bench/bench_search.py [--models lpes-tiny-kv,lpes-tiny-induction] [--cache DIR] [--replicas 1,2,4,16]

Every search runs at lpes-search's defaults (population, generations, patience, ties, grid) on each
model's own task (100 calibration examples, 100 held out), with `--baselines none` (the stock
baselines' scan after a search is the same for all). Rows:

- plain GA: every candidate on every example by greedy generation, no racing, every generation (the
  papers'). Its cost is counted from the `ga, every generation` run: racing is exact, so that run
  breeds exactly the plain GA's genomes and ends with its curve, and the plain GA scores each of
  them on every example (`--plain run` runs it for real, greedy and unraced, as a check).
- ga, every generation: lpes-search's GA (one-pass check, exact racing), `--patience 0`.
- ga: the same at the default patience.
- cmaes, every generation / cmaes: CMA-ES over the same genome and grid, without / with patience.

Verdicts are cached in DIR (bench/verdicts.py): a (candidate, example) is computed once, and a
bench that stops half-way resumes where it stopped when run again. Each search counts the tokens of
every verdict it asks for, and "model time": the seconds those verdicts took when computed (on one
thread here; the wall time an uncached run spends scoring). The plain GA's model time is its tokens
at the greedy scoring's measured seconds per token (the held-out scoring, same prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from verdicts import CachedPool, cache_path

from lpes.search import ga as ga_module
from lpes.search import run as run_module
from lpes.search.run import SearchOptions, search

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "lpes-bench-verdicts"


class Bench:
    """Runs searches through cached pools and keeps what each one spent."""

    def __init__(self, cache: Path, replicas: int = 1, progress: bool = False):
        self.cache, self.replicas, self.progress = cache, replicas, progress
        self.pool: CachedPool | None = None
        self.state = self.evaluator = None
        real_open, real_end, real_evaluator = (run_module.open_pool, ga_module.GeneticSearch._end_generation,
                                               run_module.ModelEvaluator)
        bench = self

        def open_cached(model_path, tokenizer, examples, **kwargs):
            path = cache_path(self.cache, model=model_path.name, prompts=_digest([e.prompt for e in examples]),
                              method=kwargs["method"], dtype=kwargs["dtype"], batch=kwargs["batch_size"])
            bench.pool = CachedPool(real_open(model_path, tokenizer, examples, **kwargs), path, bench.replicas)
            return bench.pool

        def keep_state(self, state, rng, scored):
            bench.state = state
            real_end(self, state, rng, scored)

        class KeptEvaluator(real_evaluator):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                bench.evaluator = self

        run_module.open_pool = open_cached
        run_module.ModelEvaluator = KeptEvaluator
        ga_module.GeneticSearch._end_generation = keep_state

    def run(self, model: str, options: SearchOptions, name: str) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            spec = search(model, Path(tmp) / "best.json", options, force=True, progress=self.progress)
            seconds = time.perf_counter() - started
        recorded = spec.provenance.to_json()  # the run's counts: the free-form part of the record
        found, state, pool = recorded["search"], self.state, self.pool
        row = {"name": name, "model": model, "tokens": found["forward_tokens"], "wall_s": seconds,
               # the seconds the verdicts it asked for took when computed (cached or not)
               "model_s": sum(u.busy_s for u in self.evaluator.usage), "fitness": found["fitness"],
               "held_out": recorded["held_out"], "scales": [round(s, 3) for s in spec.scales],
               "scored": found["evaluations"], "raced_out": found["raced_out"],
               "generations": found["generations_run"], "stop": found["stop_reason"],
               "history": found["history"], "improvements": state.improvements,
               "seen": dict(state.seen), "total": len(state.failures),
               "greedy_s_per_example": pool.greedy_seconds_per_example()}
        print(f"{model} {name}: {row['tokens']:,} tokens, {row['model_s']:.0f} s of model time "
              f"({seconds:.0f} s wall), fitness {row['fitness']:.3f}, held-out {row['held_out']['lpes']:.3f}, "
              f"{row['generations']} generations{', ' + row['stop'] if row['stop'] else ''}", flush=True)
        return row


def _digest(texts: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def tokens_to(run: dict, fitness: float) -> int | None:
    """Tokens spent when the search first scored a genome of at least `fitness` in full."""
    return next((t for f, t in run["improvements"] if f >= fitness - 1e-12), None)


def plain_from(run: dict, tokens_per_example: int, seconds_per_example: float) -> dict:
    """The plain GA of `run`'s trajectory (a `ga` run at --patience 0): each genome met, on every example."""
    per_genome = tokens_per_example * run["total"]
    final = run["history"][-1]["best"]
    # The plain GA scores genomes in queue order, each in full: it first holds the final fitness at the
    # first genome that has it. Raced-out genomes are counted as having it if they could (a lower bound).
    first = min(order for value in run["seen"].values()
                for order in [value[1]] if _could_reach(value, final, run["total"]))
    genomes = run["history"][-1]["genomes"]
    return {"name": "plain GA", "model": run["model"], "tokens": genomes * per_genome,
            "wall_s": None, "model_s": genomes * run["total"] * seconds_per_example,
            "fitness": run["fitness"], "held_out": run["held_out"], "scales": run["scales"],
            "scored": genomes, "raced_out": 0, "generations": run["generations"], "stop": None,
            "to_plain_final": (first + 1) * per_genome}


def _could_reach(value: list, fitness: float, total: int) -> bool:
    if value[0] is not None:
        return value[0] >= fitness - 1e-12
    correct, done = value[2], value[3]  # [None, order, right answers, examples met, failed]
    return (correct + total - len(done)) / total >= fitness - 1e-12


def greedy_tokens_per_example(model: str) -> int:
    """Token positions greedy generation computes per calibration example (one prompt of the task, its budget)."""
    from lpes.converter.loading import load_model, load_tokenizer, resolve_model
    from lpes.validation import scoring
    from lpes.validation.tasks import examples_for, task_config

    path = resolve_model(model)
    examples = examples_for(task_config(path, None), path, use_chat_template=True, split="search")[:2]
    scores = scoring.greedy_correct(load_model(path), load_tokenizer(path), examples)
    return scores.forward_tokens // len(examples)


def table(rows: list[dict]) -> str:
    plain = next(r for r in rows if r["name"] == "plain GA")
    final = plain["fitness"]
    lines = ["| model | search | forward tokens | vs plain GA | to plain GA's final fitness | model time (s) "
             "| generations | fitness | held-out before -> after |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reach = r.get("to_plain_final") or tokens_to(r, final)
        h = r["held_out"]
        gens = f"{r['generations']}" + (" (stopped)" if r["stop"] else "")
        lines.append(f"| {r['model']} | {r['name']} | {r['tokens']:,} | {plain['tokens'] / r['tokens']:.1f}x "
                     f"| {reach:,} | {r['model_s']:.0f} | {gens} | {r['fitness']:.3f} "
                     f"| {h['unscaled']:.3f} -> {h['lpes']:.3f} |" if reach is not None else
                     f"| {r['model']} | {r['name']} | {r['tokens']:,} | {plain['tokens'] / r['tokens']:.1f}x "
                     f"| not reached | {r['model_s']:.0f} | {gens} | {r['fitness']:.3f} "
                     f"| {h['unscaled']:.3f} -> {h['lpes']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lpes-tiny-kv,lpes-tiny-induction")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="verdict cache folder (default %(default)s)")
    parser.add_argument("--replicas", default="1,2,4,16", help="replica counts for the racing table ('' to skip)")
    parser.add_argument("--racing-model", default="lpes-tiny-kv")
    parser.add_argument("--optimizers", default="ga,cmaes")
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # 2 shared cores: one thread is 2-3x faster than two here (RESULTS.md, Ray section)
    args.cache.mkdir(parents=True, exist_ok=True)
    defaults = SearchOptions(scale_grid="1:4:0.25")  # the default grid when its tables were measured
    bench = Bench(args.cache)
    rows, racing = [], []

    def run(model, name, **changes):
        return bench.run(model, replace(defaults, baselines="none", **changes), name)

    for model in args.models.split(","):
        everything = run(model, "ga, every generation", optimizer="ga", patience=0)
        greedy = greedy_tokens_per_example(model)
        plain = plain_from(everything, greedy, everything["greedy_s_per_example"])
        model_rows = [plain, everything, run(model, "ga", optimizer="ga")]
        for optimizer in [o for o in args.optimizers.split(",") if o != "ga"]:
            model_rows += [run(model, f"{optimizer}, every generation", optimizer=optimizer, patience=0),
                           run(model, optimizer, optimizer=optimizer)]
        rows += model_rows
        print("\n" + table(model_rows) + "\n", flush=True)
    for count in [int(c) for c in args.replicas.split(",") if c]:
        bench.replicas = count
        for optimizer in args.optimizers.split(","):
            row = run(args.racing_model, f"{optimizer}, {count} replicas", optimizer=optimizer)
            row["replicas"], row["optimizer"] = count, optimizer
            racing.append(row)
    bench.replicas = 1
    for r in rows + racing:
        r.pop("seen", None)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "racing": racing}, indent=1))
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end\n")
    for model in args.models.split(","):
        print(table([r for r in rows if r["model"] == model]) + "\n")
    if racing:
        print("| optimizer | replicas | forward tokens | vs 1 replica | scored in full | raced out | fitness "
              "| same curve as 1 |")
        print("|---|---|---|---|---|---|---|---|")
        for r in racing:
            one = next(o for o in racing if o["optimizer"] == r["optimizer"] and o["replicas"] == 1)
            print(f"| {r['optimizer']} | {r['replicas']} | {r['tokens']:,} | {r['tokens'] / one['tokens']:.2f} "
                  f"| {r['scored']} | {r['raced_out']} | {r['fitness']:.3f} | {r['scales'] == one['scales']} |")


if __name__ == "__main__":
    main()
