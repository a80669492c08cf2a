"""What the model says about each layer's scale: the objective and its per-layer gradient at a uniform scale.

    OMP_NUM_THREADS=2 .venv/bin/python bench/gradient_probe.py smollm2-135m --scales 0.7+0.85+1+1.15+1.3 \
        --out bench/real/gradient_probe.json

On the search's calibration examples (the model folder's own task unless --data), for each uniform
scale s: J (search/objective.py: the gold answer's mean log-likelihood per token, each gold position
weighted equally) and dJ/ds_h for every decoder layer h, by autograd through the one per-layer RoPE
(converter/lpes_rope.py, `reference.apply_differentiable`), in float32 with the weights frozen; also J
by gold index. A positive dJ/ds_h says layer h wants more interpolation (s_h > s), a negative one less
(compression towards s_h < s). Prints a line per scale and writes every number to --out, with the
run's time and peak RSS (what one forward + backward over the calibration set costs).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.converter.reference import apply_differentiable
from lpes.search.objective import gold_weights
from lpes.validation.own_answers import own_answer_examples
from lpes.validation.scoring import answer_logprob_batches, greedy_correct
from lpes.validation.tasks import examples_for, task_config


def probe(model, tokenizer, examples, scale: float, batch_size: int, backward: bool = True) -> dict:
    layers = model.config.num_hidden_layers
    weights = gold_weights([e.gold_index for e in examples])
    scales = torch.full((layers,), scale, dtype=torch.float32, requires_grad=backward)
    by_gold: dict[int, list[float]] = {}
    objective, tokens = 0.0, 0
    hinge = capped = argmax_right = 0.0  # the worst-token margin: min(m, 0), min(m, 1), and the verdict m > 0
    for start in range(0, len(examples), batch_size):
        ids = list(range(start, min(start + batch_size, len(examples))))
        apply_differentiable(model, scales)
        [(rows, positions)] = list(answer_logprob_batches(model, tokenizer, [examples[i] for i in ids],
                                                          grad=backward, batches=[list(range(len(ids)))]))
        part = sum(weights[i] * r.logprob for i, r in zip(ids, rows))
        if backward:
            part.backward()
        objective += float(part.detach())
        for i, r in zip(ids, rows):
            margin = float(r.margin.detach())
            hinge += weights[i] * min(margin, 0.0)
            capped += weights[i] * min(margin, 1.0)
            argmax_right += weights[i] * (margin > 0)
        tokens += positions
        for i, r in zip(ids, rows):
            by_gold.setdefault(examples[i].gold_index, []).append(float(r.logprob.detach()))
    return {"scale": scale, "objective": objective,
            "gradient": [float(g) for g in scales.grad] if backward else None,
            "margin_hinge": hinge, "margin_capped": capped, "teacher_forced_right": argmax_right,
            "objective_by_gold_index": {str(g): sum(v) / len(v) for g, v in sorted(by_gold.items())},
            "positions": tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--scales", default="1", help="uniform scales, joined by +")
    parser.add_argument("--data", default=None, help="lpes-search's --data (default: the model folder's task)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--forward-only", action="store_true", help="the objective alone (a finer uniform scan)")
    parser.add_argument("--objective", choices=["logprob", "answer-logprob"], default="logprob",
                        help="answer-logprob: the unscaled model's own answers with the gold value are the targets")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model_path = resolve_model(args.model)
    model = load_model(model_path, dtype="float32")
    model.requires_grad_(False)
    tokenizer = load_tokenizer(model_path)
    task = task_config(model_path, args.data)
    examples = examples_for(task, model_path, tokenizer=tokenizer, split="search")
    targets = None
    if args.objective == "answer-logprob":  # as lpes-search does it (search/run.py, _use_own_answers)
        generated = [r.generated for r in greedy_correct(model, tokenizer, examples, args.batch_size).results]
        examples, targets = own_answer_examples(examples, generated)
        print(f"targets: {targets}; e.g. {examples[0].answer!r}", flush=True)
    rows = []
    for scale in (float(s) for s in args.scales.split("+")):
        started = time.perf_counter()
        row = probe(model, tokenizer, examples, scale, args.batch_size, backward=not args.forward_only)
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        gradient = " ".join(f"{g:+.3f}" for g in row["gradient"]) if row["gradient"] else "-"
        print(f"s={scale:g}: J={row['objective']:.4f}, worst-token margin: min(m,0) {row['margin_hinge']:.3f}, "
              f"min(m,1) {row['margin_capped']:.3f}, m>0 {row['teacher_forced_right']:.3f}; "
              f"by gold {row['objective_by_gold_index']} "
              f"({row['seconds']} s); dJ/ds_h: {gradient}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "examples": len(examples), "data": args.data, "objective": args.objective,
              "answer_targets": targets, "targets": [e.answer for e in examples], "threads": torch.get_num_threads(),
              "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2), "rows": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
