"""lpes-search MODEL --out best.json: flags -> SearchOptions -> search()."""

from __future__ import annotations

import argparse

from lpes.foundation.commands import ArgumentParser
from lpes.foundation.spec import MAX_DEGREE
from lpes.search.genome import MAX_GRID_VALUES
from lpes.search.optimizers import registry as optimizers
from lpes.search.options import (
    DTYPE_CHOICES,
    FACTOR_SCALE_GRID,
    GA_POPULATION,
    LINEAR_SCALE_GRID,
    MAX_BATCH_SIZE,
    MAX_GENERATIONS,
    MAX_HOLDOUT,
    MAX_POPULATION,
    OBJECTIVES,
    SearchOptions,
)
from lpes.search.run import search
from lpes.validation.tasks import DATA_FLAG, DATA_HELP

DEFAULTS = SearchOptions()

EPILOG = """\
examples:
  lpes-search lpes-tiny-kv --out kv-out/best.json --data tiny-kv:examples=8 --population 12 --generations 8
  lpes-search lpes-tiny-kv --out best.json --population 12 --generations 6
  lpes-search meta-llama/Llama-2-7b-chat-hf --out best.json --data kv:pairs=75,examples=40,gold=0+24+49+74
  lpes-search lpes-tiny-kv --out grad-out/best.json --optimizer gradient --objective logprob --scale-grid 0.5:4:0.25

{data}The held-out examples (--holdout, default 200) come from the same description with seed
2*S+1 (as many per gold index as it takes), or from a file's held-out half (capped at what it
holds; the search says so in one line), taken in turn from each gold index.

The search ends with a decision on them: the unscaled model, the best uniform scale, each stock
baseline and the per-layer curve are each scored on every held-out prompt, and McNemar's exact
test holds each against the simpler ones, on all prompts and on the middle (gold at 25-75% of
the context). best.json's provenance.decision names the simplest that no more complex one beats
at p < --alpha, with the table and the reason in one line; lpes-convert ships it.

Fitness (Eq. 7 of the LPES paper) is the share of calibration examples answered correctly,
checked in one forward pass per example (teacher forcing; docs/search.md). --objective logprob
climbs the mean log-likelihood of the gold answer's tokens instead (each gold position counts
the same), which moves with every curve where verdicts do not; --optimizer gradient climbs it
by autograd through the per-layer RoPE, one Adam step per mini-batch. For a chat model, which
answers in a sentence, --objective answer-logprob scores the unscaled model's own answer with the
gold value in it, so that a curve pays for changing how the model answers. Candidates that
cannot reach the current parents are raced out early, and no scale vector is scored
twice, so the result is that of a plain GA at a fraction of the cost (bench/RESULTS.md).
The state is saved after every generation: run the same command again to resume an
interrupted search. Writes the spec (--out) and, next to it, NAME_curve.png and
NAME_fitness.png. All of it, the decision and what best.json holds: docs/search.md.
"""


def build_parser() -> argparse.ArgumentParser:
    """lpes-search's flags (also used by the tests of every --help example)."""
    parser = ArgumentParser(
        prog="lpes-search",
        description="Find the per-layer RoPE scale curve (LPES) for MODEL: CMA-ES (default) or the papers' GA.",
        epilog=EPILOG.format(data=DATA_HELP),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="bundled short name (lpes-tiny-kv), local model folder, or Hub id")
    parser.add_argument("--out", required=True, help="spec file to write (best.json); plots go next to it")
    parser.add_argument("--data", default=None,
                        help="what to calibrate on: " + DATA_FLAG + "the model folder's lpes_task.json, else kv "
                        "with 75 pairs, 25 examples, gold 0+24+49+74")
    parser.add_argument("--optimizer", default=DEFAULTS.optimizer, choices=list(optimizers()),
                        help="what breeds the candidates: ga (the papers' genetic algorithm), cmaes (CMA-ES over "
                        "the same genome and grid; both race exactly and resume alike), or gradient (Adam on the "
                        "curve's control scales, within the --scale-grid bounds; needs a likelihood --objective) "
                        "(default %(default)s)")
    parser.add_argument("--objective", default=DEFAULTS.objective, choices=list(OBJECTIVES),
                        help="what the optimizer climbs: accuracy (Eq. 7, right/wrong verdicts), answer-accuracy "
                        "(the verdicts on the unscaled model's own greedy answer with the gold value in it, "
                        "teacher-forced: one forward pass per prompt, for chat models, which answer in a sentence), "
                        "logprob (the gold answer's mean log-likelihood, each gold position weighted equally) or "
                        "answer-logprob (the same of the own answer); held-out checks and validation report "
                        "accuracy either way (default %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=DEFAULTS.learning_rate, metavar="LR",
                        help="--optimizer gradient: Adam's step in log-scale per generation (default %(default)s)")
    parser.add_argument("--population", type=int, default=DEFAULTS.population,
                        help=f"genomes per generation, 2..{MAX_POPULATION} (default: {GA_POPULATION} for ga, "
                        "6 for cmaes)")
    parser.add_argument("--generations", type=int, default=DEFAULTS.generations,
                        help=f"generations after the first, 0..{MAX_GENERATIONS}, at most (default %(default)s)")
    parser.add_argument("--patience", type=int, default=DEFAULTS.patience, metavar="K",
                        help="stop once the best curve has not changed for K generations (the first population "
                        "counts: it races the uniform scan's best), or can no longer change (fitness 1.0 with "
                        "--ties first); 0 runs every generation (default %(default)s)")
    parser.add_argument("--degree", type=int, default=DEFAULTS.degree,
                        help=f"Bezier degree, 1..{MAX_DEGREE} (default 3: cubic, as the paper)")
    parser.add_argument("--scale-grid", default=DEFAULTS.scale_grid, metavar="MIN:MAX:STEP",
                        help=f"candidate scale values, both ends included, at most {MAX_GRID_VALUES} "
                        f"(default {LINEAR_SCALE_GRID}; {FACTOR_SCALE_GRID} with --rope-type yarn or dynamic)")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed,
                        help="seed of the search and of generated data (default %(default)s)")
    parser.add_argument("--holdout", type=int, default=DEFAULTS.holdout,
                        help="held-out examples behind the decision, taken in turn from each gold index: the "
                        "--data description with seed 2*S+1, or a file's held-out half (capped, with a note); "
                        f"0..{MAX_HOLDOUT}, 0: no decision (default %(default)s)")
    parser.add_argument("--exact-scan", action="store_true",
                        help="scan the uniform scales and the stock factors by the exact race alone (default: "
                        "successive halving first, which keeps the best third on twice the examples each round)")
    parser.add_argument("--alpha", type=float, default=DEFAULTS.alpha, metavar="A",
                        help="the decision's significance level, in (0, 1): a more complex candidate ships only "
                        "when it beats the simpler ones at p < A (default %(default)s)")
    parser.add_argument("--serve-length", type=int, default=None, metavar="TOKENS",
                        help="the longest prompt the shipped model is meant to serve: each candidate is checked "
                        "against the unscaled model at lengths doubling from the search length up to it (the "
                        "next-token loss on a long text), one that breaks at any is not shipped, and a shorter "
                        "limit is written into what ships (default: the model's max_position_embeddings, or the "
                        "search length where that is longer)")
    parser.add_argument("--beyond-trained", action="store_true",
                        help="let --serve-length pass the model's own context")
    parser.add_argument("--length-text", default=None, metavar="FILE",
                        help="the UTF-8 text the length checks read (default: the Python reference manual's topics, "
                        "which every Python has)")
    parser.add_argument("--length-minutes", type=float, default=None, metavar="M",
                        help="time for the length checks; the ladder stops at the last length reached, and what "
                        "ships carries it as its limit (default: a quarter of the search's own time, at least 2)")
    parser.add_argument("--device", default=None, help="e.g. cuda:0,cuda:1 (default: every visible GPU, else cpu)")
    parser.add_argument("--dtype", default=DEFAULTS.dtype, choices=DTYPE_CHOICES,
                        help="precision of the searched model. auto (default): bfloat16 on a GPU that has it "
                        "(float16 on older ones), the precision large checkpoints ship in and run at; float32 "
                        "on a CPU, where half-precision matmuls are slow and inexact. The spec records the "
                        "one used")
    parser.add_argument("--gpus-per-replica", type=int, default=DEFAULTS.gpus_per_replica, metavar="K",
                        help="split each model replica over K GPUs (transformers' device map), for models "
                        "that do not fit on one (default %(default)s)")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="score in Ray actors, one replica each: auto (the running cluster, or RAY_ADDRESS), "
                        "local (start Ray on this machine) or host:port; needs pip install 'lpes[ray]'")
    parser.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="with --ray: N actors (default: one per K GPUs of the cluster, else 1 on CPUs)")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                        help=f"examples per forward pass, 1..{MAX_BATCH_SIZE} (default %(default)s)")
    parser.add_argument("--method", default=DEFAULTS.method, choices=["teacher-forced", "greedy"],
                        help="how a candidate is scored (greedy: the paper's way, slower)")
    parser.add_argument("--ties", default=DEFAULTS.ties, choices=["gentle", "first"],
                        help="at equal fitness prefer the gentler curve (smaller sum |log s|; default) or the "
                        "first one found (the papers' plain GA, cheaper: gentler curves of equal fitness "
                        "need not be scored in full)")
    parser.add_argument("--baselines", default=DEFAULTS.baselines, metavar="TYPES",
                        help="stock RoPE types to scan after the search, each at its best factor of the grid "
                        "(>= 1) on the calibration examples, for validation to score beside the curve: yarn, "
                        "dynamic (NTK), comma-separated, or none (default %(default)s)")
    parser.add_argument("--rope-type", default=DEFAULTS.rope_type, choices=["linear", "yarn", "dynamic"],
                        help="how each layer applies its scale s_h: linear (inv_freq / s_h, default), or "
                        "transformers' yarn or dynamic (NTK) RoPE at factor s_h, so that one factor for every "
                        "layer is that stock type and the uniform scan is its baseline (needs plain RoPE; "
                        "--scale-grid from 1 up). There is no static ntk: transformers has none")
    parser.add_argument("--no-racing", dest="racing", action="store_false",
                        help="score every candidate on every example (same result, more work)")
    parser.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                        help="do not wrap prompts in the tokenizer's chat template (the spec records the choice; "
                        "lpes-convert and lpes-validate then validate the same way)")
    parser.add_argument("--answer-tokens", type=int, default=None, metavar="N",
                        help="tokens the model may write before the value must have appeared, scored by greedy "
                        "generation (the benchmark: 100); default: the task's (100 for kv, the value's own tokens "
                        "for the bundled tasks, checked in one forward pass); recorded in the spec")
    parser.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = SearchOptions(
        data=args.data, population=args.population, generations=args.generations, degree=args.degree,
        scale_grid=args.scale_grid, seed=args.seed, holdout=args.holdout, device=args.device, dtype=args.dtype,
        method=args.method, ties=args.ties, racing=args.racing, batch_size=args.batch_size,
        chat_template=args.chat_template, ray=args.ray, replicas=args.replicas,
        gpus_per_replica=args.gpus_per_replica, baselines=args.baselines, rope_type=args.rope_type,
        answer_tokens=args.answer_tokens, optimizer=args.optimizer, patience=args.patience,
        objective=args.objective, learning_rate=args.learning_rate, alpha=args.alpha, exact_scan=args.exact_scan,
        serve_length=args.serve_length, beyond_trained=args.beyond_trained, length_text=args.length_text,
        length_minutes=args.length_minutes,
    )
    search(args.model, args.out, options, force=args.force)
    return 0
