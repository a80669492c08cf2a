"""Sizes a user can type, bounded at plan time against the model and the machine (one line each, before a
weight loads): how many prompts a run builds and encodes (--data's examples, lpes-search's --holdout), how
long they are against the positions the model was trained for, and what one forward over the longest of
them holds in memory.

- `check_prompt_memory`: the prompts a task description makes, estimated from the description before any is
  built (`tasks`' own estimate, bytes per pair or per position), times what building, checking and encoding
  them takes (PROMPT_MEMORY_PER_BYTE, measured), within PROMPT_MEMORY_SHARE of the available memory.
- `check_positions`: a prompt and its answer budget within MAX_POSITION_FACTOR times the model's
  max_position_embeddings. lpes searches and validates beyond the trained length on purpose (the bundled
  models' task is 4x theirs, bench/RESULTS.md runs lpes-tiny-induction at 16x), never at a thousand times it,
  where one prefill runs for hours and no progress line can say when it ends.
- `forward_bytes`: the KV cache and the widest layer's activations of one forward over a batch (no
  gradient), which `check_forward_memory` holds against the memory of the device.
"""

from __future__ import annotations

from lpes.foundation.devices import format_bytes
from lpes.foundation.errors import LpesError

MAX_POSITION_FACTOR = 64
# Building, checking (vocabulary.check_vocabulary: the tokenizer's encodings of every prompt at once) and
# encoding prompts peaks at about 40 bytes of memory per byte of prompt text (measured: 1,000 tiny-kv prompts
# of 8,192 positions, 30 MB of text, 1.2 GB); 64 leaves room for tokenizers that cut text finer.
PROMPT_MEMORY_PER_BYTE = 64
PROMPT_MEMORY_SHARE = 0.5  # of the available memory: the weights and the scoring need the rest
# What one forward without gradient keeps alive per token besides the KV cache, in units of the dtype: the
# residual stream, a norm's output, q/k/v and the attention output (about 8 x hidden) and the MLP's gate, up
# and product (3 x intermediate), for one layer at a time.
FORWARD_PER_HIDDEN = 8
FORWARD_PER_INTERMEDIATE = 3
FORWARD_MARGIN = 1.25


def estimated_prompt_bytes(config) -> int | None:
    """Bytes of text of every prompt a task (tasks.TaskConfig) makes, from its description (None: a file's
    records, which are as large as the file the user has)."""
    from lpes.validation.tasks import _KV_BYTES_PER_PAIR, _TINY_BYTES_PER_POSITION, BUNDLED_TASKS

    if config.file is not None or config.examples_per_index is None:
        return None
    if config.task in BUNDLED_TASKS:
        per_prompt = _TINY_BYTES_PER_POSITION * (config.length or 0)
    else:
        per_prompt = _KV_BYTES_PER_PAIR * config.num_pairs
    return per_prompt * config.examples_per_index * len(config.resolved_gold_indices())


def check_prompt_memory(parts: list[tuple[str, object]], available: int | None = None) -> None:
    """The prompts of every (flag, tasks.TaskConfig) in `parts` are within tasks.MAX_PROMPT_BYTES each and fit
    in memory, together, to be built and encoded; else LpesError (one line) naming the flag (the one that asks
    for the most). `available`: None reads this machine's."""
    from lpes.converter.loading import available_memory
    from lpes.validation.tasks import MAX_PROMPT_BYTES

    sizes = [(flag, estimated_prompt_bytes(config), config) for flag, config in parts]
    sizes = [(flag, size, config) for flag, size, config in sizes if size]
    for flag, size, config in sizes:  # --data's own are refused by tasks; lpes-search's held-out ones here
        if size > MAX_PROMPT_BYTES:
            raise LpesError(f"{flag}: {config.examples_per_index} examples x {len(config.resolved_gold_indices())} "
                            f"gold indices of this size make about {format_bytes(size)} of prompts (at most "
                            f"{format_bytes(MAX_PROMPT_BYTES)}); ask for fewer examples, pairs or positions")
    if not sizes:
        return
    need = sum(size for _, size, _ in sizes) * PROMPT_MEMORY_PER_BYTE
    available = available_memory() if available is None else available
    if available is None or need <= PROMPT_MEMORY_SHARE * available:
        return
    flag, size, config = max(sizes, key=lambda part: part[1])
    prompts = config.examples_per_index * len(config.resolved_gold_indices())
    raise LpesError(f"{flag}: {prompts:,} prompts of this size make about {format_bytes(size)} of text, and "
                    f"building and encoding every prompt of the run takes about {format_bytes(need)} of memory; "
                    f"{format_bytes(available)} is available: ask for fewer examples or shorter prompts")


def trained_positions(config) -> int | None:
    text = getattr(config, "text_config", None) or config
    trained = getattr(text, "max_position_embeddings", None)
    return trained if isinstance(trained, int) and trained > 0 else None


def position_limit(config) -> int | None:
    """The most positions a prompt and its answer may reach on this model (None: the config does not say)."""
    trained = trained_positions(config)
    return None if trained is None else MAX_POSITION_FACTOR * trained


def check_positions(config, longest: int, what: str, model: str, hint: str) -> None:
    """LpesError (one line) when `longest` positions (a prompt and its answer budget) are beyond
    MAX_POSITION_FACTOR x the model's trained length. `what`: the flag or task; `hint`: what to ask for."""
    limit = position_limit(config)
    if limit is None or longest <= limit:
        return
    trained = trained_positions(config)
    raise LpesError(f"{what}: its prompts reach {longest:,} positions with the answer's budget, "
                    f"{longest / trained:,.0f}x the {trained:,} {model} was trained for; lpes goes up to "
                    f"{MAX_POSITION_FACTOR}x ({limit:,}): {hint}")


def forward_bytes(config, batch_tokens: int, dtype_bytes: int) -> int:
    """Memory one forward without gradient over `batch_tokens` positions (every row's, padding included)
    holds beyond the weights: every layer's keys and values (generation keeps them) and one layer's
    activations."""
    text = getattr(config, "text_config", None) or config
    hidden, layers, heads = text.hidden_size, text.num_hidden_layers, text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    cache = layers * 2 * kv_heads * head_dim
    activations = FORWARD_PER_HIDDEN * hidden + FORWARD_PER_INTERMEDIATE * intermediate
    return int(batch_tokens * (cache + activations) * dtype_bytes)


def batch_tokens(longest: int, rows: int, max_batch_tokens: int) -> int:
    """The padded positions of the widest batch scoring forms: `rows` rows of `longest` up to
    `max_batch_tokens`, and always at least one row (scoring._batches)."""
    return max(longest, min(rows * longest, max_batch_tokens))


def check_forward_memory(config, longest: int, tokens: int, dtype_bytes: int, available: int | None,
                         what: str) -> int:
    """LpesError (one line) when a forward over `tokens` padded positions (rows of at most `longest`) would
    not fit in `available` bytes with FORWARD_MARGIN; returns its estimate."""
    need = forward_bytes(config, tokens, dtype_bytes)
    if available is not None and need * FORWARD_MARGIN > available:
        one = forward_bytes(config, longest, dtype_bytes)
        hint = (f"lower --batch-size (one {longest:,}-position prompt needs about {format_bytes(one)})"
                if tokens > longest and one * FORWARD_MARGIN <= available
                else "ask for shorter prompts or use a machine with more memory")
        raise LpesError(f"{what}: a forward over the widest batch ({tokens:,} positions) keeps about "
                        f"{format_bytes(need)} of keys, values and activations, {format_bytes(available)} "
                        f"available; {hint}")
    return need
