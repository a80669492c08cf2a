"""Does a RoPE candidate hold at longer prompts? Next-token loss by position on one long natural text, paired.

A decision made at one prompt length ships for every length the model serves (issue 50). Checking each
candidate at longer lengths with the task's own verdicts would cost a prefill per prompt per length; one
pass over a long text gives the loss at every position, so every rung of the ladder of lengths, for the cost
of one prompt. The candidate and the unscaled model read the same tokens, so their losses pair position by
position; the positions of a rung, (previous rung, rung], are cut into blocks of BLOCK tokens and a block
counts as worse where the candidate's mean loss there is higher. A candidate *breaks* at a rung when more
blocks are worse than better with a sign test's p < alpha (the binomial test McNemar's is) *and* its mean
excess over the rung is at least MARGIN nats a token: a RoPE change costs every length a little (SmolLM2's
uniform s = 0.75 costs 0.01-0.05 nats below 6k tokens), and that is not what "breaks" means here.

The text: the Python reference manual's topics (pydoc_data.topics), which every CPython installation has
(about 100k tokens of English prose with code), under the PSF licence; a user's own with --length-text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lpes.foundation.decision import LENGTH_MARGIN, RungCheck, binomial_p
from lpes.foundation.errors import LpesError, shown

BLOCK = 16  # tokens a paired block holds: a first rung of 374 positions still makes 23 blocks
MARGIN = LENGTH_MARGIN  # nats a token: the least mean excess over a rung that counts as a break (perplexity x1.05)
CHUNK = 512  # tokens a forward pass takes at a time (the KV cache carries the rest): logits stay small
TEXT_NAME = "pydoc_data.topics"
UNKNOWN_SHARE = 0.05  # at most this share of the probe's tokens may be the tokenizer's unknown token


def builtin_text() -> str:
    """The Python reference manual's topics, in a fixed order: the same text on every machine."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def read_text(path: str | Path) -> str:
    """--length-text: a UTF-8 text file; one line naming what is wrong, else."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise LpesError(f"--length-text {shown(path)}: {err.strerror.lower()}") from None
    if b"\0" in data:
        raise LpesError(f"--length-text {shown(path)} is binary (it holds NUL bytes); give a text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LpesError(f"--length-text {shown(path)} is not UTF-8 text") from None
    if not text.strip():
        raise LpesError(f"--length-text {shown(path)} is empty")
    return text


def probe_ids(tokenizer, tokens: int, text: str | None = None, where: str = TEXT_NAME) -> list[int]:
    """The first `tokens` token ids of the text (the built-in one by default); LpesError when it is shorter."""
    try:
        ids = tokenizer(text if text is not None else builtin_text(), add_special_tokens=True)["input_ids"]
    except Exception as err:  # a word-level tokenizer without an unknown token (the bundled models') refuses words
        raise LpesError(f"the model's tokenizer cannot read the length probe's text ({where}): "
                        f"{str(err).splitlines()[0][:80]}; give a text in its vocabulary with --length-text") from None
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and sum(i == unknown for i in ids[:tokens]) > UNKNOWN_SHARE * min(len(ids), tokens):
        raise LpesError(f"the model's tokenizer reads most of the length probe's text ({where}) as unknown words; "
                        "give a text in its vocabulary with --length-text")
    if len(ids) < tokens:
        raise LpesError(f"the length probe's text ({where}) has {len(ids):,} tokens, shorter than the longest rung "
                        f"({tokens:,}); give a longer one with --length-text")
    return list(ids[:tokens])


def token_losses(model, ids: Sequence[int], chunk: int = CHUNK,
                 keep_going: Callable[[int], bool] | None = None) -> list[float]:
    """The next-token loss (nats) at positions 1..len(ids)-1 of one sequence, computed a chunk at a time over a
    KV cache (a logits tensor of the whole sequence would not fit: Gemma 3's 262k vocabulary at 32k positions
    is 34 GB). `keep_going(positions done)` False stops early: the losses so far are returned."""
    import torch

    from lpes.validation.shared_greedy import cache_keyword

    device, keyword = next(model.parameters()).device, cache_keyword(model)
    sequence = torch.tensor([list(ids)], device=device)
    losses: list[float] = []
    cache = None
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, chunk):
            piece = sequence[:, start:start + chunk]
            out = model(input_ids=piece, use_cache=True, **{keyword: cache},
                        position_ids=torch.arange(start, start + piece.shape[1], device=device)[None])
            cache = out[keyword]  # the output names the cache as forward takes it
            targets = sequence[0, start + 1:start + 1 + piece.shape[1]]
            logits = out.logits[0, :len(targets)].float()
            losses += torch.nn.functional.cross_entropy(logits, targets, reduction="none").tolist()
            if keep_going is not None and not keep_going(start + piece.shape[1]):
                break
    return losses


def compare_by_rung(candidate: Sequence[float], unscaled: Sequence[float], rungs: Sequence[int],
                    start: int = 0) -> list[RungCheck]:
    """Paired losses (position i is the loss of predicting token i+1) cut at `rungs` (token counts), the first
    rung's positions beginning at `start`."""
    results, low = [], start
    for rung in rungs:
        high = min(rung - 1, len(candidate), len(unscaled))
        diffs = [c - u for c, u in zip(candidate[low:high], unscaled[low:high])]
        blocks = [diffs[i:i + BLOCK] for i in range(0, len(diffs) - BLOCK + 1, BLOCK)]
        means = [sum(b) / len(b) for b in blocks]
        worse, better = sum(m > 0 for m in means), sum(m < 0 for m in means)
        excess = sum(diffs) / len(diffs) if diffs else 0.0
        results.append(RungCheck(rung, round(excess, 6), worse, better, binomial_p(worse, better)))
        low = high
    return results


def detectable_blocks(alpha: float) -> int:
    """The fewest blocks, all worse, at which the sign test reaches p < alpha."""
    return math.floor(1 - math.log2(alpha)) + 1


def timed(function: Callable[[], list[float]]) -> tuple[list[float], float]:
    started = time.perf_counter()
    return function(), time.perf_counter() - started
