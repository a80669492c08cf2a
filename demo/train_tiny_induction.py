"""Train the bundled model `lpes-tiny-induction` on CPU, save it, and measure per-layer vs uniform RoPE scales.

The task is `lpes.validation.tiny_induction`: a fact is a key token followed by
its value token, so the model needs a previous-token head (exact local order)
feeding a retrieval head (long range) in a later layer; docs in that module and
in demo/tiny_induction_training.md (tables: demo/tiny_induction_results.md).

    python demo/train_tiny_induction.py                   # train, save, evaluate
    python demo/train_tiny_induction.py --eval-only       # evaluate a saved folder again

Recipe (the trials that led to it are in demo/tiny_induction_training.md):
a Llama of 4 layers, hidden 128, 4 heads, tied input/output embeddings; key and
query tokens share one random embedding, values and fillers random, all at std
0.5; a length curriculum up to 256 positions; 4 queries per training row. Besides
the answers (and <eos> after the last), three training-only targets take the
composition off its plateau: at every fact's value position "which key stood
right before you"; layer 0 head 0 attends to the previous token; head 0 of
layer 1 attends from each query to the value it asks for. AdamW, lr 2e-3.
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import time
from pathlib import Path

import tiny_training  # demo/tiny_training.py, beside this script
import torch
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from lpes.converter import reference
from lpes.foundation.spec import Spec, StockRope
from lpes.validation import scoring
from lpes.validation import tiny_induction as task

TRAIN_LENGTH = 256
MAX_TRAIN_PAIRS = 24
ROPE_THETA = 10000.0
# What search and validation use for this model by default: twice the training length, where the
# unscaled model loses far facts and any uniform scale breaks the offset-2 head (see the training notes).
TASK_DEFAULTS = {"num_pairs": 16, "length": 512, "gold_indices": [0, 4, 8, 12, 15]}
EVAL_LENGTHS = (256, 512, 1024)
# Per-layer scale vectors of the closing table (4 layers): unscaled, uniform, and the split the task is
# built for: layer 0 (previous-token head) unscaled, the layers after it compressed.
EVAL_SCALES = (
    (1, 1, 1, 1), (1.25, 1.25, 1.25, 1.25), (1.5, 1.5, 1.5, 1.5), (2, 2, 2, 2), (4, 4, 4, 4),
    (1, 2, 2, 2), (1, 4, 4, 4), (1, 4, 1, 1), (4, 1, 1, 1),
)
# The stock length-extension RoPE types every runtime has, the same in every layer (rows after the scales).
EVAL_STOCK = (StockRope("yarn", 2.0), StockRope("yarn", 4.0), StockRope("dynamic", 2.0), StockRope("dynamic", 4.0))
EVAL_SEED = 1000  # not a seed that lpes-search or lpes-validate derive from the task's seed (0 and 1)


def parse_args() -> argparse.Namespace:
    # One thread: on a shared 2-core machine two threads spend their time waiting for each other (3.4 s a
    # step against 1 s). The report is the table only; demo/tiny_induction_training.md is the account around it.
    parser = tiny_training.base_parser(__doc__, "lpes/models/lpes-tiny-induction", 1300, 1, "tiny_induction_results.md")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--aux-weight", type=float, default=1.0, help="weight of the previous-token target")
    parser.add_argument("--curriculum-steps", type=int, default=1000, help="steps until prompts reach full length")
    parser.add_argument("--queries", type=int, default=4, help="queries per training row")
    parser.add_argument("--adaptive", type=float, default=0.0,
                        help="grow the length only while the answer accuracy is at least this (0: fixed schedule)")
    parser.add_argument("--tie", action=argparse.BooleanOptionalAction, default=True,
                        help="tie the input embeddings and the LM head (copying a token is then the identity)")
    parser.add_argument("--attention-weight", type=float, default=1.0,
                        help="weight of the attention targets: layer 0 head 0 attends to the previous token, "
                        "--retrieval-layer head 0 from each query to its value")
    parser.add_argument("--retrieval-layer", type=int, default=1)
    parser.add_argument("--decoys", type=int, default=task.DECOYS,
                        help="key tokens between a fact's key and its value (0: key then value)")
    return parser.parse_args()


def model_config(args: argparse.Namespace) -> LlamaConfig:
    ids = task.token_ids()
    return LlamaConfig(
        vocab_size=len(task.vocabulary()),
        hidden_size=128,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        intermediate_size=256,
        max_position_embeddings=TRAIN_LENGTH,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=args.tie,
        pad_token_id=ids[task.PAD_TOKEN],
        bos_token_id=ids[task.BOS_TOKEN],
        eos_token_id=ids[task.EOS_TOKEN],
    )


@torch.no_grad()
def init_embeddings(model: LlamaForCausalLM, generator: torch.Generator) -> None:
    """Key and query tokens share one random vector per key; values and fillers random; all std 0.5.

    The shared key/query vector makes "does this key match the query" easy from
    step 0; std 0.5 (not the default 0.02) keeps token identity strong next to
    the attention outputs (see the notes).
    """
    width = model.config.hidden_size
    table = model.get_input_embeddings().weight
    ids = task.token_ids()
    keys = 0.5 * torch.randn(task.NUM_KEYS, width, generator=generator)
    for k in range(task.NUM_KEYS):
        table[ids[task.key_token(k)]] = keys[k]
        table[ids[task.query_token(k)]] = keys[k]
    for v in range(task.NUM_VALUES):
        table[ids[task.value_token(v)]] = 0.5 * torch.randn(width, generator=generator)
    for n in range(task.NUM_FILLERS):
        table[ids[task.filler_token(n)]] = 0.5 * torch.randn(width, generator=generator)


class Curriculum:
    """(length, pairs) per batch; the longest length grows to TRAIN_LENGTH.

    Fixed: linearly over `curriculum_steps`. Adaptive (`adaptive` > 0): one position
    per step while the recent answer accuracy is at least `adaptive`, and never
    slower than the fixed schedule stretched to twice as many steps.
    """

    def __init__(self, args: argparse.Namespace):
        self.args, self.longest, self.recent = args, 8, 0.0

    def draw(self, step: int, rng: random.Random) -> tuple[int, int]:
        length = rng.randint(task.min_length(1, self.args.decoys) + 2, max(self.longest, 8))
        pairs = rng.randint(1, min(MAX_TRAIN_PAIRS, (length - 2) // (2 + self.args.decoys)))
        return length, pairs

    def update(self, step: int, answer_accuracy: float) -> None:
        args = self.args
        if args.adaptive <= 0:
            self.longest = _linear(step + 1, args.curriculum_steps)
            return
        self.recent = 0.9 * self.recent + 0.1 * answer_accuracy
        grown = self.longest + 1 if self.recent >= args.adaptive else self.longest
        self.longest = min(TRAIN_LENGTH, max(grown, _linear(step + 1, 2 * args.curriculum_steps)))


def _linear(step: int, steps: int) -> int:
    return min(TRAIN_LENGTH, 8 + (TRAIN_LENGTH - 8) * step // max(1, steps))


def learning_rate(step: int, args: argparse.Namespace) -> float:
    return args.lr * min(1.0, (step + 1) / args.warmup)


def train(args: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(args.seed)
    config = model_config(args)
    if args.attention_weight > 0:
        config._attn_implementation = "eager"  # the only implementation that returns attention weights
    model = LlamaForCausalLM(config)
    init_embeddings(model, torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    # A string seed gives a stream unrelated to the integer seeds of the evaluation sets.
    rng = random.Random(f"tiny-induction-train-{args.seed}")
    ce = torch.nn.functional.cross_entropy
    schedule = Curriculum(args)
    model.train()
    start, logs = time.time(), []
    for step in range(args.steps):
        length, pairs = schedule.draw(step, rng)
        batch = task.make_batch(rng, args.batch_size, length, pairs, args.queries, args.decoys)
        output = model(input_ids=batch.ids, output_attentions=args.attention_weight > 0)
        logits = output.logits.flatten(0, 1)
        targets, key_targets = batch.targets.flatten(), batch.key_targets.flatten()
        answers = (targets != task.IGNORE) & (targets != task.token_ids()[task.EOS_TOKEN])
        answer_loss = ce(logits[answers], targets[answers])
        eos_loss = ce(logits[~answers], targets[~answers], ignore_index=task.IGNORE)
        key_loss = ce(logits, key_targets, ignore_index=task.IGNORE)
        loss = answer_loss + eos_loss + args.aux_weight * key_loss
        if args.attention_weight > 0:
            loss = loss + args.attention_weight * attention_loss(output.attentions, batch, args)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        answer_hit = _accuracy(logits[answers], targets[answers])
        logs.append((answer_loss.item(), key_loss.item(), answer_hit, _accuracy(logits, key_targets)))
        schedule.update(step, answer_hit)
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            means = [sum(column) / len(column) for column in zip(*logs)]
            print(
                f"step {step + 1:5d}  max_len {schedule.longest:3d}  answer loss {means[0]:.3f}  "
                f"key loss {means[1]:.3f}  answer acc {means[2]:.3f}  key acc {means[3]:.3f}  "
                f"{time.time() - start:6.0f}s",
                flush=True,
            )
            logs = []
    print(f"training wall time: {time.time() - start:.0f}s", flush=True)
    return model


def attention_loss(attentions: tuple[torch.Tensor, ...], batch: task.Batch, args: argparse.Namespace) -> torch.Tensor:
    """-log attention of layer 0 head 0 on the token a key stands before its value, plus of the retrieval head
    on the asked value."""
    eps = 1e-6
    offset = 1 + args.decoys  # t attends to t - offset
    previous = attentions[0][:, 0].diagonal(offset=-offset, dim1=-2, dim2=-1)
    prev_loss = -(previous + eps).log().mean()
    queries = batch.sources != task.IGNORE
    rows, positions = queries.nonzero(as_tuple=True)
    retrieved = attentions[args.retrieval_layer][rows, 0, positions, batch.sources[rows, positions]]
    return prev_loss - (retrieved + eps).log().mean()


def _accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    kept = targets != task.IGNORE
    return (logits[kept].argmax(-1) == targets[kept]).float().mean().item()


def save(model: LlamaForCausalLM, out: Path, args: argparse.Namespace) -> None:
    ids = task.token_ids()
    generation = GenerationConfig(
        do_sample=False,
        max_new_tokens=2,  # the answer, then <eos>
        bos_token_id=ids[task.BOS_TOKEN],
        pad_token_id=ids[task.PAD_TOKEN],
        eos_token_id=ids[task.EOS_TOKEN],
    )
    tiny_training.save_model_folder(model, out, task.build_tokenizer(), generation,
                                    {"task": task.TASK_NAME, **TASK_DEFAULTS}, readme(args))


def readme(args: argparse.Namespace) -> str:
    return f"""# lpes-tiny-induction

A tiny Llama ({args.layers} layers, hidden 128, {args.heads} heads, MLP 256, RoPE theta 10000, tied
embeddings, float32) trained from scratch on CPU for LPES demos and tests. A fact is a key
token, another (decoy) key token, then the value; the model answers a query with the value,
then `<eos>`. That takes an exact-offset head (the key stands exactly two places before its
value: local order) in layer 0 and a retrieval head (long range) in layer 1, which is where
per-layer RoPE scaling beats every uniform scale. It was trained only up to {TRAIN_LENGTH} positions.

- Task and tokenizer: `lpes.validation.tiny_induction` (word-level, {len(task.vocabulary())} tokens).
  Prompt: `f3 k12 k40 v5 f30 ... q12`, answer: `v5` then `<eos>`.
- `lpes_task.json`: the task defaults that search and validation use for this model.
- Made by: `python demo/train_tiny_induction.py --steps {args.steps} --seed {args.seed}` (1 thread);
  tables in `demo/tiny_induction_training.md`.
"""


def accuracy_by_gold(model: LlamaForCausalLM, tokenizer, scales: list[float] | StockRope, length: int,
                     per_index: int, seed: int, decoys: int = task.DECOYS) -> dict[int, float]:
    """Teacher-forced accuracy of the answer token (lpes's own scoring) by gold index, with per-layer scales
    or a stock RoPE type in every layer."""
    if isinstance(scales, StockRope):
        reference.use_stock_rope(model, scales)
    else:
        reference.apply(model, Spec.from_scales(scales))
    examples = task.make_examples(TASK_DEFAULTS["num_pairs"], length, TASK_DEFAULTS["gold_indices"], per_index, seed,
                                  decoys)
    one_at_a_time = isinstance(scales, StockRope) and scales.length_dependent
    scores = scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=1 if one_at_a_time else 25)
    return scores.accuracy_by_gold_index()


def evaluate(folder: Path, per_index: int) -> str:
    """A markdown table: one row per (length, scale vector), accuracy by gold index and mean."""
    model = LlamaForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    gold_indices = TASK_DEFAULTS["gold_indices"]
    header = "| length | scales | " + " | ".join(f"gold {g}" for g in gold_indices) + " | mean |"
    lines = [header, "|" + "---|" * (len(gold_indices) + 3)]
    for length in EVAL_LENGTHS:
        for scales in [[float(s) for s in vector] for vector in EVAL_SCALES] + list(EVAL_STOCK):
            acc = accuracy_by_gold(model, tokenizer, scales, length, per_index, EVAL_SEED)
            cells = " | ".join(f"{acc[g]:.2f}" for g in gold_indices)
            stock = isinstance(scales, StockRope)
            shown = f"{scales.name} (every layer)" if stock else ", ".join(f"{s:g}" for s in scales)
            lines.append(f"| {length} | {shown} | {cells} | {sum(acc.values()) / len(acc):.3f} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def write_report(path: Path, table: str, args: argparse.Namespace, wall_s: float | None) -> None:
    command = shlex.join(["python", "demo/train_tiny_induction.py", *sys.argv[1:]])
    timing = f"Training wall time: {wall_s:.0f} s, torch.set_num_threads({args.threads}).\n\n" if wall_s else ""
    path.write_text(
        "# lpes-tiny-induction: training and per-layer RoPE scales\n\n"
        f"Command: `{command}`\n\n{timing}"
        f"Teacher-forced accuracy of the answer token (lpes.validation.scoring), {TASK_DEFAULTS['num_pairs']} "
        f"facts, {args.eval_examples} examples per gold index and cell (seed {EVAL_SEED}); scales are per layer "
        f"(layer 0 first), applied with lpes.converter.reference; the rows named YaRN and dynamic NTK put every "
        f"layer on that stock RoPE type (transformers' own, lpes.converter.reference.use_stock_rope). Trained up "
        f"to {TRAIN_LENGTH} positions.\n\n"
        f"{table}\n"
    )


def main() -> None:
    tiny_training.run(parse_args(), train, save, evaluate, write_report)


if __name__ == "__main__":
    main()
