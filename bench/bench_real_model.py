"""A real pretrained model (smollm2-135m by default): per-token cost, peak memory, lost in the middle.

    .venv/bin/python bench/bench_real_model.py cost
    .venv/bin/python bench/bench_real_model.py position --pairs 20+100+350 --examples 40+20+5 --out bench/real

`cost`: prefill tokens/s and decode steps/s of the unscaled model at several prompt lengths
(one prompt, batch 1, float32 on this machine's threads), and the process's peak RSS.
`position`: accuracy by the position of the needed pair (0 = farthest from the query), for
the model folder's own task (6-digit numbers, 24-token answers, its chat template) at each
pair count, `examples` records per gold index; a markdown table and a plot. Every prompt's
generation and verdict (lost-in-the-middle's best_subspan_em, also checked here against the
benchmark's evaluate_kv_responses.py rule: the value, lowercased, inside the lowercased
answer) goes to OUT/position.json.
`compare`: the same held-out prompts lpes-convert validates on (the folder's task, `examples`
per gold index) for each variant of a searched spec: `unscaled`, `uniform` (its best uniform
scale), `yarn` / `dynamic` (its stock baselines at their best calibration factor), `lpes` (the
curve), each in its own process if you like (`--variants lpes`), to OUT/compare-VARIANT{TAG}.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.validation import scoring
from lpes.validation.tasks import examples_for, task_config


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def cost(model, tokenizer, lengths: list[int]) -> list[dict]:
    rows = []
    for length in lengths:
        ids = torch.randint(100, tokenizer.vocab_size - 100, (1, length))
        with torch.inference_mode():
            model(input_ids=ids[:, :64])  # warm-up
            started = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            prefill = time.perf_counter() - started
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            started = time.perf_counter()
            steps = 16
            for _ in range(steps):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            decode = time.perf_counter() - started
        rows.append({"prompt_tokens": length, "prefill_s": round(prefill, 3),
                     "prefill_tokens_per_s": round(length / prefill, 1),
                     "decode_steps_per_s": round(steps / decode, 2), "peak_rss_gb": round(peak_rss_gb(), 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


class Progress:
    """Prompts done, rate and ETA on one stderr line."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self.started = label, total, 0, time.perf_counter()

    def __call__(self, n: int) -> None:
        self.done += n
        rate = self.done / (time.perf_counter() - self.started)
        print(f"\r{self.label}: {self.done}/{self.total} prompts, {rate:.2f}/s, "
              f"ETA {(self.total - self.done) / rate / 60:.1f} min", end="", file=sys.stderr, flush=True)


POSITION_PAIRS = "20+100+350"  # the real-model task (about 400 tokens), then about 1,800 and 5,000 tokens


def position(model_path: Path, model, tokenizer, pairs: list[int], examples: list[int], out: Path) -> list[dict]:
    rows = []
    for num_pairs, per_index in zip(pairs, examples, strict=True):
        config = replace(task_config(model_path, None), num_pairs=num_pairs, gold_indices=None,
                         examples_per_index=per_index)
        items = examples_for(config, model_path, tokenizer=tokenizer, split="validation")
        tokens = len(scoring.encode_prompt(tokenizer, items[0].prompt))
        started = time.perf_counter()
        scores = scoring.greedy_correct(model, tokenizer, items, batch_size=4,
                                        progress=Progress(f"{num_pairs} pairs", len(items)))
        print(file=sys.stderr)
        benchmark_rule = [e.answer.lower() in r.generated.lower() for e, r in zip(items, scores.results)]
        rows.append({
            "pairs": num_pairs, "prompt_tokens": tokens, "examples": len(items),
            "seconds": round(time.perf_counter() - started, 1),
            "accuracy_by_gold_index": {str(k): round(v, 3) for k, v in scores.accuracy_by_gold_index().items()},
            "accuracy": round(scores.accuracy, 3),
            "verdicts_equal_evaluate_kv_responses": sum(b == r.correct for b, r in zip(benchmark_rule, scores.results)),
            "answers": [{"gold_index": e.gold_index, "value": e.answer, "generated": r.generated, "correct": r.correct}
                        for e, r in zip(items, scores.results)],
        })
        summary = {k: v for k, v in rows[-1].items() if k != "answers"}
        print(json.dumps(summary), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "position.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, out / "position.png", model_path.name)
    return rows


def compare(model_path: Path, model, tokenizer, spec_path: Path, variants: list[str], per_index: int,
            out: Path, tag: str = "", uniform_scale: float | None = None, pairs: int | None = None) -> None:
    from lpes.converter.reference import apply, use_stock_rope
    from lpes.foundation.spec import Spec, load_spec

    spec = load_spec(spec_path, model.config.num_hidden_layers)
    layers = model.config.num_hidden_layers
    config = replace(task_config(model_path, None), examples_per_index=per_index)
    if pairs:  # another length of the same task, gold positions spread as `position` spreads them
        config = replace(config, num_pairs=pairs, gold_indices=None)
    items = examples_for(config, model_path, tokenizer=tokenizer, split="validation")
    for variant in variants:
        use_stock_rope(model, None)
        label = variant
        if variant == "uniform":
            scale = uniform_scale or spec.best_uniform_scale or 1.0
            apply(model, Spec.from_scales([scale] * layers))
            label = f"uniform s={scale:g}"
        elif variant in ("yarn", "dynamic"):
            stock = next(b for b in spec.stock_baselines if b.rope_type == variant)
            use_stock_rope(model, stock)
            label = stock.name
        elif variant == "lpes":
            apply(model, spec)
            label = "LPES " + ", ".join(f"{s:g}" for s in spec.scales)
        started = time.perf_counter()
        batch = 1 if variant == "dynamic" else 4
        scores = scoring.greedy_correct(model, tokenizer, items, batch_size=batch,
                                        progress=Progress(label[:40], len(items)))
        print(file=sys.stderr)
        row = {"variant": label, "examples": len(items), "seconds": round(time.perf_counter() - started, 1),
               "accuracy": round(scores.accuracy, 3),
               "accuracy_by_gold_index": {str(k): round(v, 3) for k, v in scores.accuracy_by_gold_index().items()},
               "answers": [{"gold_index": e.gold_index, "value": e.answer, "generated": r.generated,
                            "correct": r.correct} for e, r in zip(items, scores.results)]}
        print(json.dumps({k: v for k, v in row.items() if k != "answers"}), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"compare-{variant}{tag}.json").write_text(json.dumps(row, indent=1) + "\n")


def plot(rows: list[dict], path: Path, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        indices = [int(k) for k in row["accuracy_by_gold_index"]]
        relative = [i / (row["pairs"] - 1) for i in indices]
        ax.plot(relative, list(row["accuracy_by_gold_index"].values()), marker="o",
                label=f"{row['pairs']} pairs, {row['prompt_tokens']} tokens, {row['examples']} prompts")
    ax.set_xlabel("position of the needed pair (0 = first in the context, 1 = last)")
    ax.set_ylabel("accuracy (best_subspan_em)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{name}: key-value retrieval by position, unscaled")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["cost", "position", "compare"])
    parser.add_argument("--spec", type=Path, help="compare: the searched best.json")
    parser.add_argument("--variants", default="unscaled+uniform+yarn+lpes", help="compare: joined by +")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="512+2048+8000", help="cost: prompt lengths, joined by +")
    parser.add_argument("--pairs", default=None,
                        help=f"position: pair counts, joined by + (default {POSITION_PAIRS}); compare: one pair count "
                        "(default: the model's task's)")
    parser.add_argument("--examples", default="40+20+5", help="position: records per gold index, per pair count")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="compare: OUT/compare-VARIANT{TAG}.json (keeps earlier runs)")
    parser.add_argument("--uniform-scale", type=float, default=None,
                        help="compare: the uniform variant's scale (default: the spec's best uniform scale)")
    parser.add_argument("--out", type=Path, default=Path("bench/real"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_path = resolve_model(args.model)
    model = load_model(model_path)
    tokenizer = load_tokenizer(model_path)
    if args.what == "cost":
        cost(model, tokenizer, [int(n) for n in args.lengths.split("+")])
    elif args.what == "compare":
        compare(model_path, model, tokenizer, args.spec, args.variants.split("+"), int(args.examples), args.out,
                args.tag, args.uniform_scale, int(args.pairs) if args.pairs else None)
    else:
        position(model_path, model, tokenizer, [int(n) for n in (args.pairs or POSITION_PAIRS).split("+")],
                 [int(n) for n in args.examples.split("+")], args.out)
    print(json.dumps({"peak_rss_gb": round(peak_rss_gb(), 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
