"""Search cost: lpes-search (one-pass check + exact racing) against a plain GA (greedy generation,
every candidate on every example), same model, data, population, generations and seed.

    python bench/bench_search.py [--model lpes-tiny-kv] [--population 16] [--generations 8] [--ties first]

Prints a Markdown table for bench/RESULTS.md: model-forward tokens and wall time in total
and until the final fitness was first reached, final fitness, held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from lpes.search.run import SearchOptions, search


def tokens_to_final(history: list[dict]) -> int:
    final = history[-1]["best"]
    return next(h["forward_tokens"] for h in history if h["best"] == final)


# Both runs first scan the uniform scales (the GA's seed); the tokens include that scan.


def run(model: str, options: SearchOptions, folder: Path, name: str) -> dict:
    started = time.perf_counter()
    spec = search(model, folder / f"{name}.json", options, force=True, progress=False)
    seconds = time.perf_counter() - started
    found = spec.provenance["search"]
    return {
        "name": name,
        "seconds": seconds,
        "tokens": found["forward_tokens"],
        "tokens_to_final": tokens_to_final(found["history"]),
        "tokens_to_final_genome": found["tokens_to_best_fitness"],
        "fitness": found["fitness"],
        "held_out": spec.provenance["held_out"],
        "scales": [round(s, 3) for s in spec.scales],
        "scored": found["evaluations"],
        "raced_out": found["raced_out"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lpes-tiny-kv")
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None)
    parser.add_argument("--ties", default="gentle", choices=["gentle", "first"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    # The GA's cost alone, as recorded in RESULTS.md: the stock baselines' scan after it is the same for both.
    common = dict(population=args.population, generations=args.generations, seed=args.seed, data=args.data,
                  ties=args.ties, baselines="none")
    with tempfile.TemporaryDirectory() as tmp:
        ours = run(args.model, SearchOptions(**common), Path(tmp), "lpes")
        plain = run(args.model, SearchOptions(**common, method="greedy", racing=False), Path(tmp), "plain")
    print(json.dumps({"lpes": ours, "plain": plain}, indent=1))
    print("\n| search | forward tokens | to final fitness (generation) | (genome) | wall time (s) | fitness "
          "| held-out before -> after |")
    print("|---|---|---|---|---|---|---|")
    for r in (plain, ours):
        h = r["held_out"]
        print(f"| {r['name']} | {r['tokens']:,} | {r['tokens_to_final']:,} | {r['tokens_to_final_genome']:,} "
              f"| {r['seconds']:.0f} | {r['fitness']:.3f} "
              f"| {h['unscaled']:.3f} -> {h['lpes']:.3f} |")
    print(f"\ncost ratio (tokens): {plain['tokens'] / ours['tokens']:.1f}x; to final fitness: "
          f"{plain['tokens_to_final'] / ours['tokens_to_final']:.1f}x by generation, "
          f"{plain['tokens_to_final_genome'] / ours['tokens_to_final_genome']:.1f}x by genome; wall time: "
          f"{plain['seconds'] / ours['seconds']:.1f}x; same curve: {ours['scales'] == plain['scales']}")


if __name__ == "__main__":
    main()
