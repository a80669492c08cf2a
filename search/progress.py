"""The progress line of one long step of lpes-search (a generation, the uniform scan, a baseline scan).

A step scores candidates on calibration examples; racing stops a candidate as soon as it
cannot be selected. The line shows, from the first chunk on:

    lpes-search gen 2/8:  35%|███▌      | [00:41, candidates 3/6, 1 raced out, 2450 tok/s, ETA <= 1:16]

- `candidates D/N`: the step's candidates scored in full or raced out, of all it scores;
- tok/s: model-forward token positions per second since the step began;
- the bar and the ETA count verdicts (candidate x example): those still needed at most, at the
  rate verdicts were computed so far. Racing only removes verdicts, so the step ends by the
  ETA at the latest (at a steady rate), usually well before: the ETA is an upper bound, shown `<=`.

The line is redrawn at most every REFRESH_S seconds while chunks are scored, and every time a
candidate finishes, so a slow machine shows it moving within the first chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable

REFRESH_S = 0.5
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:10}| [{elapsed}{postfix}]"


class StepProgress:
    """One step's tqdm line: `computed`/`skipped` verdicts, `finished` candidates, then `close`."""

    def __init__(self, desc: str, candidates: int, work: int, tokens: Callable[[], int], enabled: bool = True,
                 noun: str = "candidates"):
        from tqdm.auto import tqdm

        self.candidates, self.noun, self.tokens = candidates, noun, tokens
        self.finished_count = self.raced_out = self.computed_verdicts = self.done = 0
        self.work = work
        self.label = ""
        self.started, self.tokens_before = time.perf_counter(), tokens()
        self.bar = tqdm(total=max(work, 1), desc=desc, bar_format=BAR_FORMAT, mininterval=REFRESH_S,
                        leave=False, disable=not enabled, dynamic_ncols=True,
                        postfix=f"{noun} 0/{candidates}, ETA <= ?")

    def begin(self, label: str) -> None:
        """Name the candidate being scored (shown from the next redraw on)."""
        self.label = label

    def computed(self, verdicts: int) -> None:
        """`verdicts` more candidate x example verdicts scored (one chunk)."""
        self.computed_verdicts += verdicts
        self.done += verdicts
        self.bar.set_postfix_str(self.postfix(), refresh=False)
        self.bar.update(verdicts)  # redraws at most every REFRESH_S

    def skipped(self, verdicts: int) -> None:
        """`verdicts` that racing made unnecessary (a candidate dropped with examples left)."""
        self.done += verdicts
        self.bar.update(verdicts)

    def finished(self, raced_out: bool = False) -> None:
        """One candidate scored in full, or raced out."""
        self.finished_count += 1
        self.raced_out += raced_out
        self.bar.set_postfix_str(self.postfix(), refresh=True)

    def postfix(self) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = (self.tokens() - self.tokens_before) / elapsed
        left = max(0, self.work - self.done)
        eta = "?" if not self.computed_verdicts else clock(left * elapsed / self.computed_verdicts)
        parts = [self.label or None, f"{self.noun} {self.finished_count}/{self.candidates}",
                 f"{self.raced_out} raced out" if self.raced_out else None, f"{rate:.0f} tok/s", f"ETA <= {eta}"]
        return ", ".join(p for p in parts if p)

    def close(self) -> None:
        self.bar.close()


def clock(seconds: float) -> str:
    """H:MM:SS, or M:SS under an hour: how every lpes-search ETA is written."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
