"""lpes-search MODEL --out best.json: flags -> SearchOptions -> search()."""

from __future__ import annotations

import argparse

from lpes.search.run import SearchOptions, search

DEFAULTS = SearchOptions()

EPILOG = """\
examples:
  lpes-search lpes-tiny-kv --out best.json --population 12 --generations 6
  lpes-search meta-llama/Llama-2-7b-chat-hf --out best.json --data kv:pairs=75,examples=40,gold=0|24|49|74

Fitness is Eq. 7 of the paper: the share of calibration examples answered correctly,
checked in one forward pass per example (teacher forcing; see README). Candidates that
cannot reach the current parents are raced out early, and no scale vector is scored
twice, so the result is that of a plain GA at a fraction of the cost (bench/RESULTS.md).
The state is saved after every generation: run the same command again to resume an
interrupted search.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lpes-search",
        description="Find the per-layer RoPE scale curve (LPES) for MODEL with a genetic search.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="bundled short name (lpes-tiny-kv), local model folder, or Hub id")
    parser.add_argument("--out", required=True, help="spec file to write (best.json); plots go next to it")
    parser.add_argument("--data", default=None,
                        help="kv:pairs=N,examples=M,gold=I|J,seed=S or FILE.jsonl (benchmark records); "
                        "default: the model folder's lpes_task.json, else kv retrieval with 75 pairs")
    parser.add_argument("--population", type=int, default=DEFAULTS.population, help="genomes per generation")
    parser.add_argument("--generations", type=int, default=DEFAULTS.generations)
    parser.add_argument("--degree", type=int, default=DEFAULTS.degree, help="Bezier degree (3: cubic, as the paper)")
    parser.add_argument("--scale-grid", default=DEFAULTS.scale_grid, metavar="MIN:MAX:STEP",
                        help=f"candidate scale values (default {DEFAULTS.scale_grid})")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument("--holdout", type=int, default=DEFAULTS.holdout,
                        help="held-out examples for accuracy before/after (default %(default)s)")
    parser.add_argument("--device", default=None, help="e.g. cuda:0,cuda:1 (default: every visible GPU, else cpu)")
    parser.add_argument("--gpus-per-replica", type=int, default=DEFAULTS.gpus_per_replica, metavar="K",
                        help="split each model replica over K GPUs (transformers' device map), for models "
                        "that do not fit on one (default %(default)s)")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="score in Ray actors, one replica each: auto (the running cluster, or RAY_ADDRESS), "
                        "local (start Ray on this machine) or host:port; needs pip install 'lpes[ray]'")
    parser.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="with --ray: N actors (default: one per K GPUs of the cluster, else 1 on CPUs)")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    parser.add_argument("--method", default=DEFAULTS.method, choices=["teacher-forced", "greedy"],
                        help="how a candidate is scored (greedy: the paper's way, slower)")
    parser.add_argument("--ties", default=DEFAULTS.ties, choices=["gentle", "first"],
                        help="at equal fitness prefer the gentler curve (smaller sum |log s|; default) or the "
                        "first one found (the papers' plain GA, cheaper: gentler curves of equal fitness "
                        "need not be scored in full)")
    parser.add_argument("--no-racing", dest="racing", action="store_false",
                        help="score every candidate on every example (same result, more work)")
    parser.add_argument("--no-chat-template", dest="chat_template", action="store_false")
    parser.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    args = parser.parse_args(argv)
    options = SearchOptions(
        data=args.data, population=args.population, generations=args.generations, degree=args.degree,
        scale_grid=args.scale_grid, seed=args.seed, holdout=args.holdout, device=args.device,
        method=args.method, ties=args.ties, racing=args.racing, batch_size=args.batch_size,
        chat_template=args.chat_template, ray=args.ray, replicas=args.replicas,
        gpus_per_replica=args.gpus_per_replica,
    )
    search(args.model, args.out, options, force=args.force)
    return 0
