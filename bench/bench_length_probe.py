"""The length probe (validation/length_probe.py) on a real model: a candidate's next-token loss by rung against the
unscaled model's, on the built-in text, with the seconds each pass took.

    .venv/bin/python bench/bench_length_probe.py gemma3-270m --scales 0.75 --rungs 374,748,884,1496,2048
    .venv/bin/python bench/bench_length_probe.py smollm2-135m --scales 0.75 --rungs 407,1024,2048,4096,6144,8192

`--scales` takes uniform scales (a number) or a per-type form for Gemma 3 ("full=0.75": only the layers of full
attention scaled). The unscaled model is also compared with itself, which must never break.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.converter.reference import apply
from lpes.foundation.spec import Spec
from lpes.validation.length_probe import MARGIN, compare_by_rung, probe_ids, token_losses


def layer_scales(config, text: str) -> list[float]:
    layers = config.num_hidden_layers
    if text.startswith("full="):
        types = getattr(config, "layer_types", None) or ["full_attention"] * layers
        return [float(text[5:]) if t == "full_attention" else 1.0 for t in types]
    return [float(text)] * layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--scales", default="0.75", help="comma-separated candidates")
    parser.add_argument("--rungs", required=True, help="comma-separated token counts, the first the search length")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = resolve_model(args.model)
    rungs = [int(r) for r in args.rungs.split(",")]
    model, tokenizer = load_model(path), load_tokenizer(path)
    ids = probe_ids(tokenizer, rungs[-1])
    started = time.perf_counter()
    unscaled = token_losses(model, ids)
    seconds = {"unscaled": time.perf_counter() - started}
    rows = {"unscaled vs itself": compare_by_rung(unscaled, unscaled, rungs[1:], start=rungs[0] - 1)}
    for text in args.scales.split(","):
        apply(model, Spec.from_scales(layer_scales(model.config, text)))
        started = time.perf_counter()
        losses = token_losses(model, ids)
        seconds[text] = time.perf_counter() - started
        rows[f"s={text}"] = compare_by_rung(losses, unscaled, rungs[1:], start=rungs[0] - 1)
        # the search length itself, for scale: the same measure where the decision was made
        rows[f"s={text}"].insert(0, compare_by_rung(losses, unscaled, rungs[:1], start=0)[0])
    print(f"{args.model}: {rungs[-1]} tokens of the built-in text; margin {MARGIN} nats/token; alpha {args.alpha}")
    for name, results in rows.items():
        for r in results:
            verdict = "BREAKS" if r.breaks(args.alpha) else "holds"
            print(f"  {name:>20} at {r.length:>6}: {r.excess:+.3f} nats/token, blocks worse/better {r.worse}/"
                  f"{r.better}, p = {r.p:.2g}: {verdict}")
    print("  seconds per pass: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"model": args.model, "rungs": rungs, "seconds": seconds,
                       "rows": {k: [r.to_json() for r in v] for k, v in rows.items()}}, handle, indent=1)


if __name__ == "__main__":
    main()
