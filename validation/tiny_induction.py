"""The retrieval task of the bundled model `lpes-tiny-induction`: facts whose key stands two places before the value.

Unlike `tiny_kv`, where one token is a whole fact, a fact here is three tokens:
its key, a decoy key (another key token, never a fact's key), then its value.
Answering needs two skills in two layers:

- an *exact-offset* head (local order) copies the token two places back, the
  key, into the value's position; the token one place back is a key too, so
  neither "the previous token" nor "the most recent key" will do;
- a later *retrieval* head (long range) finds, from the query at the end, the
  position whose copied key matches, and copies its value.

That split is what lets per-layer RoPE scaling beat every uniform scale: the
retrieval layer wants its positions compressed beyond the training length, the
offset layer wants the offset 2 kept exactly 2 (under a linear scale s it reads
offset 2s as 2). With facts of two tokens (key then value, DECOYS = 0) a
previous-token head does the local step by recency, which no scale disturbs,
and a uniform scale ties per-layer scales: demo/tiny_induction_training.md.

Vocabulary (whitespace-separated word tokens, ids in this order):

- specials: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2, emitted after the answer);
- key tokens ``k{key}`` (64), value tokens ``v{value}`` (16),
  query tokens ``q{key}`` (64: "which value belongs to key?"),
  filler tokens ``f{n}`` (32).

A prompt is random filler with `num_pairs` facts ``k{key} k{decoy} v{value}`` of
distinct keys spread through it, then the query token of one of them, for example
``f3 k12 k33 v5 f30 f7 k40 k2 v1 f0 q12``; the answer is that fact's value token
(``v5``), then ``<eos>``. `length` counts the positions the model sees: the
tokenizer prepends ``<bos>``, so a prompt holds ``length - 2`` context tokens plus
the query. `gold_index` i means the queried fact is the i-th of the context,
0 being the earliest, i.e. the farthest from the query.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache

import torch
from transformers import PreTrainedTokenizerFast

from lpes.validation.examples import Example
from lpes.validation.tiny_kv import word_level_tokenizer

NUM_KEYS = 64
NUM_VALUES = 16
NUM_FILLERS = 32
PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
TASK_NAME = "tiny-induction"
# Key tokens between a fact's key and its value (see the module docstring): with one, the key is
# exactly two places before its value and the token in between is a key too, so neither "the most
# recent token" nor "the most recent key" finds it; only an exact offset does.
DECOYS = 1
IGNORE = -100  # cross_entropy's ignore_index: positions without a target

# Positions outside the context: <bos> in front and the query at the end.
_EXTRA_POSITIONS = 2


def min_length(num_pairs: int, decoys: int = DECOYS) -> int:
    """The fewest positions a prompt with `num_pairs` facts takes: <bos>, the facts, the query."""
    return (2 + decoys) * num_pairs + _EXTRA_POSITIONS


def key_token(key: int) -> str:
    return f"k{key}"


def value_token(value: int) -> str:
    return f"v{value}"


def query_token(key: int) -> str:
    return f"q{key}"


def filler_token(n: int) -> str:
    return f"f{n}"


def vocabulary() -> list[str]:
    """All tokens; a token's id is its index in this list."""
    keys = [key_token(k) for k in range(NUM_KEYS)]
    values = [value_token(v) for v in range(NUM_VALUES)]
    queries = [query_token(k) for k in range(NUM_KEYS)]
    fillers = [filler_token(n) for n in range(NUM_FILLERS)]
    return [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *keys, *values, *queries, *fillers]


@cache
def token_ids() -> dict[str, int]:
    """Token -> id, matching `build_tokenizer()`."""
    return {token: i for i, token in enumerate(vocabulary())}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `vocabulary()` that prepends ``<bos>``; ``<eos>`` ends an answer."""
    return word_level_tokenizer(token_ids(), BOS_TOKEN, PAD_TOKEN, EOS_TOKEN)


@dataclass(frozen=True)
class _Sample:
    """One example as tokens: context plus query, the answer, and where each fact's value sits."""

    tokens: list[str]
    answer: str
    value_slots: list[int]  # index into `tokens` of each fact's value token
    keys: list[int]  # the key of each fact, in context order


def _sample(rng: random.Random, num_pairs: int, length: int, gold_index: int, decoys: int = DECOYS) -> _Sample:
    context_len = length - _EXTRA_POSITIONS
    block = 2 + decoys  # tokens per fact
    most = min(NUM_KEYS // (1 + decoys), context_len // block)
    if not 0 <= gold_index < num_pairs <= most:
        raise ValueError(f"need 0 <= gold_index < num_pairs <= {most} "
                         f"(length {length} holds {context_len // block} facts of {block} tokens)")
    drawn = rng.sample(range(NUM_KEYS), num_pairs * (1 + decoys))
    keys, decoy_keys = drawn[:num_pairs], drawn[num_pairs:]  # a decoy is never a fact's key
    values = [rng.randrange(NUM_VALUES) for _ in keys]
    # num_pairs blocks among context_len tokens: choose their ranks among context_len - num_pairs
    # * (block - 1) items, then the i-th block starts at rank + i * (block - 1) (no overlap).
    ranks = sorted(rng.sample(range(context_len - num_pairs * (block - 1)), num_pairs))
    starts = [rank + i * (block - 1) for i, rank in enumerate(ranks)]
    tokens = [filler_token(rng.randrange(NUM_FILLERS)) for _ in range(context_len)]
    for i, (start, key, value) in enumerate(zip(starts, keys, values, strict=True)):
        fact = [key_token(key), *(key_token(d) for d in decoy_keys[i * decoys : (i + 1) * decoys])]
        tokens[start : start + block] = [*fact, value_token(value)]
    tokens.append(query_token(keys[gold_index]))
    return _Sample(tokens, value_token(values[gold_index]), [s + block - 1 for s in starts], keys)


def make_examples(
    num_pairs: int, length: int, gold_indices: list[int], examples_per_index: int, seed: int, decoys: int = DECOYS
) -> list[Example]:
    """`examples_per_index` examples for each gold index, deterministic for `seed`."""
    rng = random.Random(seed)
    examples = []
    for gold_index in gold_indices:
        for _ in range(examples_per_index):
            sample = _sample(rng, num_pairs, length, gold_index, decoys)
            examples.append(Example(" ".join(sample.tokens), sample.answer, gold_index, num_pairs))
    return examples


@dataclass(frozen=True)
class Batch:
    """Training rows ``<bos> context (query answer) x queries`` and their per-position targets."""

    ids: torch.Tensor  # (batch, length - 1 + 2 * queries)
    targets: torch.Tensor  # each query's answer at the query, <eos> at the last answer, IGNORE elsewhere
    key_targets: torch.Tensor  # at each fact's value: its key token (the previous-token step); IGNORE elsewhere
    sources: torch.Tensor  # at each query: the row index of the value it asks for; IGNORE elsewhere


def make_batch(
    rng: random.Random, batch_size: int, length: int, num_pairs: int, queries: int = 1, decoys: int = DECOYS
) -> Batch:
    """A training batch: each row asks about `queries` distinct facts (at most `num_pairs`), drawn uniformly.

    More than one query per row gives the retrieval step several targets per
    context; only the last answer is followed by <eos>, as in a prompt with one
    query. Pass the training script's own `random.Random` so its stream never
    overlaps the evaluation seeds.
    """
    vocab = token_ids()
    rows, targets, key_targets, sources = [], [], [], []
    for _ in range(batch_size):
        sample = _sample(rng, num_pairs, length, rng.randrange(num_pairs), decoys)
        context = sample.tokens[:-1]
        source = [IGNORE] * (1 + len(context))
        asked = rng.sample(range(num_pairs), min(queries, num_pairs))
        row = [vocab[BOS_TOKEN], *(vocab[t] for t in context)]
        target = [IGNORE] * len(row)
        for fact in asked:
            answer = vocab[context[sample.value_slots[fact]]]
            row += [vocab[query_token(sample.keys[fact])], answer]
            target += [answer, IGNORE]
            source += [sample.value_slots[fact] + 1, IGNORE]  # +1: <bos> comes first
        target[-1] = vocab[EOS_TOKEN]
        key_target = [IGNORE] * len(row)
        for slot, key in zip(sample.value_slots, sample.keys, strict=True):
            key_target[slot + 1] = vocab[key_token(key)]  # +1: <bos> comes first
        rows.append(row)
        targets.append(target)
        key_targets.append(key_target)
        sources.append(source)
    return Batch(torch.tensor(rows), torch.tensor(targets), torch.tensor(key_targets), torch.tensor(sources))
