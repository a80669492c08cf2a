"""The objective and the optimizer, side by side: accuracy/CMA-ES, logprob/CMA-ES, logprob/gradient.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_objective.py --out bench/objective

Every search runs at lpes-search's defaults (population, generations, patience, grid, held-out
examples) on each model's own task, with `--baselines none` (the stock scan after a search is the
same for all), uncached: what the command costs. Tokens are token-equivalents: a position of a
forward pass counts 1, a position of a forward and backward pass 3 (search/fitness.py). Held-out
accuracy is the benchmark's verdict (greedy within the answer budget) on the held-out split, the
same for every row. Writes OUT/objective.json (one row per search, its history included) and
OUT/objective.png (held-out accuracy against tokens spent).

The real models' searches run by hand (a search there takes 10-30 min on two cores; their commands are
in bench/RESULTS.md) enter the same table and plot from their files, without running anything:

    .venv/bin/python bench/bench_objective.py --models none --real bench/objective/real_rows.json

where each entry of the JSON list names a model, a row, the search's spec (its tokens) and the
bench_real_model.py compare files of the curve and of the unscaled model (held-out accuracy); a
curve of one scale everywhere may name that uniform scale's (or the unscaled) run, with "uniform".
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from premise import load  # bench/premise.py: a compare file's answers, or position.json's unscaled row

from lpes.search.run import SearchOptions, search

CONFIGS = {  # row name -> what differs from lpes-search's defaults
    "accuracy / CMA-ES": {},
    "logprob / CMA-ES": {"objective": "logprob"},
    "logprob / gradient": {"objective": "logprob", "optimizer": "gradient"},
}


def run(model: str, name: str, extra: dict) -> dict:
    # The grid of lpes-search's defaults when this table was measured (now 0.5:4:0.25), so that it reproduces.
    options = SearchOptions(baselines="none", scale_grid="1:4:0.25", **extra)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        spec = search(model, Path(tmp) / "best.json", options, force=True, progress=False)
        seconds = time.perf_counter() - started
    recorded = spec.provenance.to_json()  # the run's counts: the free-form part of the record
    found, held = recorded["search"], recorded["held_out"]
    return {"model": model, "config": name, "options": extra, "seconds": round(seconds), "held_out": held,
            "tokens": found["forward_tokens"], "tokens_to_best": found["tokens_to_best_fitness"],
            "generations": found["generations_run"], "fitness": found["fitness"], "scales": list(spec.scales),
            "history": [{k: h[k] for k in ("generation", "best", "forward_tokens")} for h in found["history"]]}


def real_row(entry: dict) -> dict:
    """A row of a search run by hand: tokens from its spec, held-out accuracy from its compare files."""
    spec = json.loads(Path(entry["spec"]).read_text())
    found = spec["provenance"]["search"]
    # A curve of one scale in every layer is held out by that uniform variant's run ("uniform": the scale).
    if "uniform" in entry and set(spec["scales"]) != {entry["uniform"]}:
        raise SystemExit(f"{entry['spec']}: not {entry['uniform']} in every layer; hold its curve out itself")
    answers = {name: load(entry[name])[1] for name in ("lpes", "unscaled")}  # FILE or position.json:PAIRS
    accuracy = {name: sum(a["correct"] for a in rows) / len(rows) for name, rows in answers.items()}
    return {"model": entry["model"], "config": entry["config"], "options": {}, "seconds": None,
            "held_out": accuracy, "held_out_prompts": len(answers["lpes"]),
            "tokens": found["forward_tokens"], "tokens_to_best": found.get("tokens_to_best_fitness"),
            "generations": found.get("generations_run"), "fitness": found.get("fitness"),
            "scales": list(spec["scales"]), "spec": entry["spec"]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    markers = dict(zip([*CONFIGS, "answer-logprob / gradient", "answer-accuracy / CMA-ES"], "osDv^"))
    for k, model in enumerate(dict.fromkeys(r["model"] for r in rows)):
        for r in (r for r in rows if r["model"] == model):
            ax.scatter(r["tokens"], 100 * r["held_out"]["lpes"], color=f"C{k}", s=50,
                       marker=markers.get(r["config"], "P"), label=f"{model}: {r['config']}")
        unscaled = next(r for r in rows if r["model"] == model)["held_out"]["unscaled"]
        ax.axhline(100 * unscaled, color=f"C{k}", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("token-equivalents spent by the search (forward 1, forward+backward 3)")
    ax.set_ylabel("held-out accuracy, % (dotted: unscaled)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.savefig(path, bbox_inches="tight")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="lpes-tiny-kv,lpes-tiny-induction")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="row names, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("bench/objective"))
    parser.add_argument("--real", type=Path, help="a JSON list of searches run by hand, added from their files")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "objective.json"
    rows = json.loads(results.read_text()) if results.exists() else []
    for entry in json.loads(args.real.read_text()) if args.real else []:
        row = real_row(entry)
        rows = [r for r in rows if (r["model"], r["config"]) != (row["model"], row["config"])] + [row]
        print(f"| {row['model']} | {row['config']} | {100 * row['held_out']['unscaled']:.1f} | "
              f"{100 * row['held_out']['lpes']:.1f} | {row['tokens']:,} |", flush=True)
    results.write_text(json.dumps(rows, indent=1) + "\n")
    for model in [] if args.models == "none" else args.models.split(","):
        for name in args.configs.split(","):
            rows = [r for r in rows if (r["model"], r["config"]) != (model, name)]
            row = run(model, name, CONFIGS[name])
            rows.append(row)
            print(f"| {model} | {name} | {100 * row['held_out']['unscaled']:.1f} | {100 * row['held_out']['lpes']:.1f}"
                  f" | {row['tokens']:,} | {row['tokens_to_best']:,} | {row['generations']} | {row['seconds']} |",
                  flush=True)
            results.write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.out / "objective.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
