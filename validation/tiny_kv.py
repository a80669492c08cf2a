"""The compact key-value retrieval task of the bundled tiny model (`lpes-tiny-kv`).

Vocabulary (618 whitespace-separated word tokens, ids in this order):

- specials: ``<pad>`` (0), ``<bos>`` (1);
- pair tokens ``p{key}_{value}`` for 64 keys x 8 values (ids 2-513): one token is
  one whole fact "key -> value";
- query tokens ``q{key}`` (ids 514-577): "which value does key have?";
- answer tokens ``a{value}`` (ids 578-585): the value, the model's target;
- filler tokens ``f{n}`` (ids 586-617): noise that pads the context.

A prompt is random filler with `num_pairs` pair tokens of distinct keys spread
through it, then the query token of one of them, for example
``f3 p12_5 f30 f7 p40_1 f0 q12``; the answer is that pair's answer token (``a5``).
`length` is the number of positions the model sees: the tokenizer prepends
``<bos>``, so a prompt holds ``length - 2`` context tokens plus the query.

`gold_index` i means the queried pair is the i-th pair token of the context,
0 being the earliest, i.e. the farthest from the query.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from lpes.validation.examples import Example

NUM_KEYS = 64
NUM_VALUES = 8
NUM_FILLERS = 32
PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
TASK_NAME = "tiny-kv"

# Positions outside the context: <bos> in front and the query at the end.
_EXTRA_POSITIONS = 2


def min_length(num_pairs: int) -> int:
    """The fewest positions a prompt with `num_pairs` facts takes: <bos>, one token per fact, the query."""
    return num_pairs + _EXTRA_POSITIONS


def pair_token(key: int, value: int) -> str:
    return f"p{key}_{value}"


def query_token(key: int) -> str:
    return f"q{key}"


def answer_token(value: int) -> str:
    return f"a{value}"


def filler_token(n: int) -> str:
    return f"f{n}"


def vocabulary() -> list[str]:
    """All tokens; a token's id is its index in this list."""
    pairs = [pair_token(k, v) for k in range(NUM_KEYS) for v in range(NUM_VALUES)]
    queries = [query_token(k) for k in range(NUM_KEYS)]
    answers = [answer_token(v) for v in range(NUM_VALUES)]
    fillers = [filler_token(n) for n in range(NUM_FILLERS)]
    return [PAD_TOKEN, BOS_TOKEN, *pairs, *queries, *answers, *fillers]


@cache
def token_ids() -> dict[str, int]:
    """Token -> id, matching `build_tokenizer()`."""
    return {token: i for i, token in enumerate(vocabulary())}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `vocabulary()` that prepends ``<bos>``."""
    return word_level_tokenizer(token_ids(), BOS_TOKEN, PAD_TOKEN)


def word_level_tokenizer(
    vocab: dict[str, int], bos_token: str, pad_token: str, eos_token: str | None = None
) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over `vocab` that prepends `bos_token` (the bundled models' kind).

    There is no unknown token on purpose: a word outside the vocabulary is an
    error, not a silent substitute.
    """
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos_token} $A", special_tokens=[(bos_token, vocab[bos_token])]
    )
    # The WordPiece decoder joins tokens with spaces; no token starts with "##".
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    specials = {"eos_token": eos_token} if eos_token is not None else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos_token,
        pad_token=pad_token,
        # Left padding keeps every prompt's last token at the last position.
        padding_side="left",
        **specials,
    )


@dataclass(frozen=True)
class _Sample:
    """One example as tokens: context plus query, and the answer token."""

    tokens: list[str]
    answer: str


def _sample(rng: random.Random, num_pairs: int, length: int, gold_index: int) -> _Sample:
    context_len = length - _EXTRA_POSITIONS
    if not 0 <= gold_index < num_pairs <= min(NUM_KEYS, context_len):
        raise ValueError(f"need 0 <= gold_index < num_pairs <= {min(NUM_KEYS, context_len)}")
    keys = rng.sample(range(NUM_KEYS), num_pairs)
    values = [rng.randrange(NUM_VALUES) for _ in keys]
    slots = sorted(rng.sample(range(context_len), num_pairs))
    tokens = [filler_token(rng.randrange(NUM_FILLERS)) for _ in range(context_len)]
    # keys/values are in random order, so assigning them to sorted slots keeps
    # the pair order random while slot i holds the i-th pair of the context.
    for slot, key, value in zip(slots, keys, values, strict=True):
        tokens[slot] = pair_token(key, value)
    tokens.append(query_token(keys[gold_index]))
    return _Sample(tokens, answer_token(values[gold_index]))


def make_examples(
    num_pairs: int, length: int, gold_indices: list[int], examples_per_index: int, seed: int
) -> list[Example]:
    """`examples_per_index` examples for each gold index, deterministic for `seed`."""
    rng = random.Random(seed)
    examples = []
    for gold_index in gold_indices:
        for _ in range(examples_per_index):
            sample = _sample(rng, num_pairs, length, gold_index)
            examples.append(Example(" ".join(sample.tokens), sample.answer, gold_index, num_pairs))
    return examples


def make_batch(rng: random.Random, batch_size: int, length: int, num_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training ids ``(batch_size, length)`` with ``<bos>`` first, and target ids ``(batch_size,)``.

    The gold index is drawn uniformly per example. Pass the training script's own
    `random.Random` so its stream never overlaps the evaluation seeds.
    """
    vocab = token_ids()
    rows, targets = [], []
    for _ in range(batch_size):
        sample = _sample(rng, num_pairs, length, rng.randrange(num_pairs))
        rows.append([vocab[BOS_TOKEN], *(vocab[t] for t in sample.tokens)])
        targets.append(vocab[sample.answer])
    return torch.tensor(rows), torch.tensor(targets)
