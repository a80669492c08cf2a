"""The ladder of lengths a decision covers (issue 50): from the search length up to the longest prompt the shipped
model serves, each candidate's next-token loss against the unscaled model's (validation/length_probe.py).

The rungs double from the search length and end at the serving length (`rungs`). The unscaled model reads the
probe text first, within a share of the time budget; the ladder goes as far as it got (a rung it did not reach
is not checked, and the decision says so), and every other candidate reads the same tokens. A candidate that
computes the unscaled model over the checked length (dynamic NTK within the trained length) is not run again.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from lpes.foundation.decision import Lengths
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import StockRope

MAX_RUNGS = 16


def rungs(search: int, serve: int) -> list[int]:
    """search x 2, x 4, ... below `serve`, then `serve`; none where `serve` is the search length."""
    out, length = [], search * 2
    while length < serve and len(out) < MAX_RUNGS - 1:
        out.append(length)
        length *= 2
    return out + [serve] if serve > search else []


def check_serve_length(serve: Any, search: int, trained: int, beyond: bool) -> int:
    """--serve-length against the search length and the model's own context: one line where it cannot be."""
    from lpes.foundation.spec_fields import MAX_POSITIONS, is_int

    if not is_int(serve) or serve < 1 or serve > MAX_POSITIONS:
        raise LpesError(f"--serve-length must be a positive number of tokens, got {serve!r}")
    if serve < search:
        raise LpesError(f"--serve-length {serve:,} is below the search length ({search:,} tokens, prompt and answer): "
                        "a decision holds from where it was made; give at least that")
    if serve > max(trained, search) and not beyond:
        raise LpesError(f"--serve-length {serve:,} is beyond the model's own context ({trained:,} positions); "
                        "add --beyond-trained to check the candidates that far")
    return serve


def run_ladder(pool, candidates: list[tuple[str, Any]], ids: list[int] | None, search: int, serve: int, trained: int,
               budget_seconds: float | None, probe: str, progress: bool, unreadable: str | None = None) -> Lengths:
    """Each candidate (name, what a replica scores), the unscaled model first, on the probe's `ids` (`serve`
    tokens): its loss against the unscaled model's at every rung reached within `budget_seconds`."""
    from lpes.validation.length_probe import compare_by_rung

    ladder = rungs(search, serve)
    if ids is None:  # no text the tokenizer reads reached past the search length: checked there only
        return Lengths(search, serve, trained, search, probe, (), unreadable)
    share = None if budget_seconds is None else budget_seconds / max(1, len(candidates))
    started = time.perf_counter()
    unscaled = pool.token_losses(candidates[0][1], ids, share)
    reached = len(unscaled) + 1
    checked = max([search] + [r for r in ladder if r <= reached])
    stopped = None
    if checked < serve:
        stopped = (f"the unscaled model read {reached:,} tokens of the probe in {time.perf_counter() - started:.0f} s, "
                   f"its share of the {budget_seconds:.0f} s budget (--length-minutes)")
    checks = []
    for number, (name, candidate) in enumerate(candidates[1:], 2):
        if isinstance(candidate, StockRope) and candidate.same_as_unscaled(checked, trained):
            continue  # the unscaled model itself over every checked length
        if progress:
            print(f"lpes-search: lengths {number}/{len(candidates)}: {name} on {checked:,} tokens", file=sys.stderr,
                  flush=True)
        losses = pool.token_losses(candidate, ids[:checked], None)
        results = compare_by_rung(losses, unscaled, [r for r in ladder if r <= checked], start=search - 1)
        checks.append((name, tuple(results)))
    if progress:
        budget = "" if budget_seconds is None else f" (budget {budget_seconds:.0f} s)"
        print(f"lpes-search: lengths: checked up to {checked:,} tokens in {time.perf_counter() - started:.0f} s"
              f"{budget}", file=sys.stderr, flush=True)
    return Lengths(search, serve, trained, checked, probe, tuple(checks), stopped)
