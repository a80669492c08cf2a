"""Train the bundled tiny retrieval model `lpes-tiny-kv` on CPU, save it, and show its RoPE position effect.

The task is `lpes.validation.tiny_kv` (one token per key-value fact, a query token,
the answer token predicted at the last position). The recipe follows
docs/tiny-model-notes.md: a Llama of 4 layers, hidden 128; embeddings
initialised compositionally; a length curriculum up to 256 positions; AdamW.

    python demo/train_tiny_kv.py                       # train, save, evaluate
    python demo/train_tiny_kv.py --eval-only           # evaluate a saved folder again

The closing table is accuracy by gold index at lengths 256/512/1024 for uniform
RoPE scales s = 1, 2, 4, each applied as rope_type "linear" with factor s on the
same weights (every layer's inv_freq divided by s).
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
from transformers import (
    AutoConfig,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from lpes.validation import tiny_kv
from lpes.validation.tasks import TASK_DEFAULTS

TRAIN_LENGTH = 256
MAX_TRAIN_PAIRS = 32
ROPE_THETA = 10000.0
# What search and validation use for this model by default (its lpes_task.json): the task's
# built-in pairs and length (validation/tasks.py), where the unscaled model has lost the far
# facts but the near ones are still found, scored at every fourth fact and the last.
MODEL_TASK = {
    "num_pairs": TASK_DEFAULTS[tiny_kv.TASK_NAME].num_pairs,
    "length": TASK_DEFAULTS[tiny_kv.TASK_NAME].length,
    "gold_indices": [0, 4, 8, 12, 15],
}
EVAL_LENGTHS = (256, 512, 1024)
EVAL_SCALES = (1.0, 2.0, 4.0)


def parse_args() -> argparse.Namespace:
    return tiny_training.base_parser(__doc__, "lpes/models/lpes-tiny-kv", 2500, 2, "tiny_kv_training.md").parse_args()


def model_config(rope_parameters: dict | None = None) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tiny_kv.vocabulary()),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=256,
        max_position_embeddings=TRAIN_LENGTH,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,
        pad_token_id=tiny_kv.token_ids()[tiny_kv.PAD_TOKEN],
        bos_token_id=tiny_kv.token_ids()[tiny_kv.BOS_TOKEN],
        eos_token_id=None,
    )


@torch.no_grad()
def init_compositional_embeddings(model: LlamaForCausalLM, generator: torch.Generator) -> None:
    """Pair token = key vector + value vector, query token = key vector.

    Without this the 512 pair embeddings are learned from sparse updates and
    training sits on a plateau at chance (see the notes).
    """
    width = model.config.hidden_size
    keys = 0.5 * torch.randn(tiny_kv.NUM_KEYS, width, generator=generator)
    values = 0.5 * torch.randn(tiny_kv.NUM_VALUES, width, generator=generator)
    ids = tiny_kv.token_ids()
    table = model.get_input_embeddings().weight
    for k in range(tiny_kv.NUM_KEYS):
        table[ids[tiny_kv.query_token(k)]] = keys[k]
        for v in range(tiny_kv.NUM_VALUES):
            table[ids[tiny_kv.pair_token(k, v)]] = keys[k] + values[v]


def curriculum(step: int, rng: random.Random) -> tuple[int, int]:
    """(length, pairs) for one batch; the longest length grows to TRAIN_LENGTH by about step 2480."""
    longest = min(TRAIN_LENGTH, 8 + step // 10)
    length = rng.randint(4, longest)
    pairs = rng.randint(1, min(MAX_TRAIN_PAIRS, (length - 2) // 2))
    return length, pairs


def learning_rate(step: int, args: argparse.Namespace) -> float:
    return args.lr * min(1.0, (step + 1) / args.warmup)


def train(args: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(model_config())
    init_compositional_embeddings(model, torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    # A string seed gives a stream unrelated to the integer seeds of the evaluation sets.
    rng = random.Random(f"tiny-kv-train-{args.seed}")
    model.train()
    start, losses, hits = time.time(), [], []
    for step in range(args.steps):
        length, pairs = curriculum(step, rng)
        ids, targets = tiny_kv.make_batch(rng, args.batch_size, length, pairs)
        logits = model(input_ids=ids, logits_to_keep=1).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        hits.append((logits.argmax(-1) == targets).float().mean().item())
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            print(
                f"step {step + 1:5d}  max_len {min(TRAIN_LENGTH, 8 + step // 10):3d}  "
                f"loss {sum(losses) / len(losses):.3f}  acc {sum(hits) / len(hits):.3f}  "
                f"{time.time() - start:6.0f}s",
                flush=True,
            )
            losses, hits = [], []
    print(f"training wall time: {time.time() - start:.0f}s", flush=True)
    return model


def save(model: LlamaForCausalLM, out: Path, args: argparse.Namespace) -> None:
    ids = tiny_kv.token_ids()
    generation = GenerationConfig(
        do_sample=False,
        max_new_tokens=1,
        bos_token_id=ids[tiny_kv.BOS_TOKEN],
        pad_token_id=ids[tiny_kv.PAD_TOKEN],
    )
    task = {"task": tiny_kv.TASK_NAME, **MODEL_TASK}
    tiny_training.save_model_folder(model, out, tiny_kv.build_tokenizer(), generation, task, readme(args))


def readme(args: argparse.Namespace) -> str:
    return f"""# lpes-tiny-kv

A tiny Llama (4 layers, hidden 128, 4 heads, MLP 256, RoPE theta 10000, ~0.8M
parameters, float32) trained from scratch on CPU for LPES demos and tests. It
retrieves one fact from a context of facts and filler, and was trained only up
to {TRAIN_LENGTH} positions, so beyond that it loses far facts unless RoPE is scaled.

- Task and tokenizer: `lpes.validation.tiny_kv` (word-level, 618 tokens).
  Prompt: `f3 p12_5 f30 ... q12`, answer: `a5` (the value of key 12).
- `lpes_task.json`: the task defaults that search and validation use for this model.
- Made by: `python demo/train_tiny_kv.py --steps {args.steps} --seed {args.seed}`;
  accuracy tables in `demo/tiny_kv_training.md`.
"""


def load_scaled(folder: Path, scale: float) -> LlamaForCausalLM:
    """The saved weights with every layer's inv_freq divided by `scale` (linear RoPE scaling)."""
    config = AutoConfig.from_pretrained(folder)
    if scale != 1.0:
        config.rope_parameters = {"rope_type": "linear", "factor": scale, "rope_theta": ROPE_THETA}
    return LlamaForCausalLM.from_pretrained(folder, config=config).eval()


@torch.no_grad()
def accuracy_by_gold(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, length: int, per_index: int
) -> dict[int, float]:
    """Greedy accuracy of the last-position argmax, per gold index."""
    gold_indices = MODEL_TASK["gold_indices"]
    # One seed per length so every scale is scored on the same examples.
    examples = tiny_kv.make_examples(MODEL_TASK["num_pairs"], length, gold_indices, per_index, seed=length)
    correct = dict.fromkeys(gold_indices, 0)
    for start in range(0, len(examples), 50):
        chunk = examples[start : start + 50]
        batch = tokenizer([e.prompt for e in chunk], return_tensors="pt", padding=True)
        predicted = model(**batch, logits_to_keep=1).logits[:, -1].argmax(-1)
        for example, token_id in zip(chunk, predicted.tolist(), strict=True):
            correct[example.gold_index] += tokenizer.convert_ids_to_tokens(token_id) == example.answer
    return {g: correct[g] / per_index for g in gold_indices}


def evaluate(folder: Path, per_index: int) -> str:
    """A markdown table: one row per (length, scale), accuracy by gold index and mean."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    gold_indices = MODEL_TASK["gold_indices"]
    header = "| length | s | " + " | ".join(f"gold {g}" for g in gold_indices) + " | mean |"
    lines = [header, "|" + "---|" * (len(gold_indices) + 3)]
    for scale in EVAL_SCALES:
        model = load_scaled(folder, scale)
        for length in EVAL_LENGTHS:
            acc = accuracy_by_gold(model, tokenizer, length, per_index)
            cells = " | ".join(f"{acc[g]:.2f}" for g in gold_indices)
            mean = sum(acc.values()) / len(acc)
            lines.append(f"| {length} | {scale:g} | {cells} | {mean:.2f} |")
            print(lines[-1], flush=True)
    return "\n".join([header, lines[1], *sorted(lines[2:], key=_row_order)])


def _row_order(row: str) -> tuple[int, float]:
    length, scale = row.split("|")[1:3]
    return int(length), float(scale)


def write_report(path: Path, table: str, args: argparse.Namespace, wall_s: float | None) -> None:
    command = shlex.join(["python", "demo/train_tiny_kv.py", *sys.argv[1:]])
    timing = f"Training wall time: {wall_s:.0f} s on 2 CPU threads.\n\n" if wall_s is not None else ""
    path.write_text(
        "# lpes-tiny-kv: training and RoPE position effect\n\n"
        f"Command: `{command}`\n\n{timing}"
        f"Accuracy by gold index (0 = farthest fact from the query), {MODEL_TASK['num_pairs']} pairs, "
        f"{args.eval_examples} examples per gold index and cell; greedy argmax of the last-position "
        f"logits. Trained up to {TRAIN_LENGTH} positions; s is a uniform linear RoPE scale "
        '(rope_type "linear", factor s: every layer\'s inv_freq / s).\n\n'
        f"{table}\n"
    )


def main() -> None:
    tiny_training.run(parse_args(), train, save, evaluate, write_report)


if __name__ == "__main__":
    main()
