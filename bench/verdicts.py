"""A verdict cache for the search benches: each (candidate, example) scored once, on disk, across runs.

A verdict depends only on (candidate, example) (exactly so in float32 on the CPU, tested), so
searches that meet the same candidate can share its verdicts, and a bench too long for one
sitting can be run again: what was computed is read back, the rest is computed and appended.
Each search still counts what it would compute itself: the tokens of every verdict it asks
for, and the seconds they took when first computed ("model time"), whether they came from
the cache or not.

`CachedPool` wraps a real pool (search/replicas.py) and may pretend to have more replicas than
it has: jobs for N replicas are computed one after the other on the real one, so the racing of
N replicas is replayed exactly (its tokens are counted as N replicas would compute them).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from lpes.search.candidates import ShareResult


def cache_path(folder: Path, **what) -> Path:
    """One file per model, data, method, dtype and batch size (what a verdict depends on)."""
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"verdicts-{what.get('model', 'model')}-{digest}.jsonl"


class CachedPool:
    """A ReplicaPool whose verdicts come from `path` when known, else from `pool` (and are appended)."""

    def __init__(self, pool, path: Path, size: int | None = None):
        self.pool, self.path = pool, path
        self.size = size or pool.size
        self.layout = {**pool.layout, "replicas": self.size}
        self.cache: dict[tuple[str, int], tuple[bool, int, float]] = {}
        self.greedy: dict[str, tuple[float, int, float]] = {}
        self.computed_tokens = 0  # what this process computed itself (not read from the cache)
        if path.is_file():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("greedy"):
                    if "v" in row:  # a cache written before verdicts were kept holds accuracies only
                        self.greedy[row["c"]] = (row["v"], row["t"], row["s"])
                else:
                    self.cache[(row["c"], row["i"])] = (row["v"], row["t"], row["s"])

    def score(self, candidate, shares: list[list[int]]) -> list[ShareResult]:
        return self.score_many([(candidate, share) for share in shares])

    def score_many(self, jobs) -> list[ShareResult]:
        results = []
        for slot, (candidate, ids) in enumerate(jobs):
            key = repr(candidate)
            missing = [i for i in ids if (key, i) not in self.cache]
            if missing:
                [real] = self.pool.score(candidate, [missing])
                self.computed_tokens += real.forward_tokens
                per_token, per_second = real.forward_tokens / len(missing), real.busy_s / len(missing)
                rows = []
                for i, ok in zip(real.example_ids, real.verdicts):
                    self.cache[(key, i)] = (ok, round(per_token), per_second)
                    rows.append({"c": key, "i": i, "v": ok, "t": round(per_token), "s": per_second})
                self._append(rows)
            known = [self.cache[(key, i)] for i in ids]
            results.append(ShareResult(slot % self.size, tuple(ids), tuple(v for v, _, _ in known),
                                       sum(t for _, t, _ in known), sum(s for _, _, s in known)))
        return results

    def greedy_verdicts(self, candidate, examples) -> list[bool]:
        key = repr(candidate) + "|" + hashlib.sha256("\n".join(e.prompt for e in examples).encode()).hexdigest()[:16]
        if key not in self.greedy:
            started = time.perf_counter()
            verdicts = self.pool.greedy_verdicts(candidate, examples)
            self.greedy[key] = (verdicts, len(examples), time.perf_counter() - started)
            self._append([{"greedy": True, "c": key, "v": verdicts, "t": len(examples), "s": self.greedy[key][2]}])
        return self.greedy[key][0]

    def greedy_seconds_per_example(self) -> float:
        """Seconds per example the greedy scorings in the cache took (0 if there were none)."""
        examples = sum(n for _, n, _ in self.greedy.values())
        return sum(s for _, _, s in self.greedy.values()) / examples if examples else 0.0

    def close(self) -> None:
        self.pool.close()

    def _append(self, rows: list[dict]) -> None:
        with self.path.open("a") as handle:
            handle.write("".join(json.dumps(row) + "\n" for row in rows))
            handle.flush()
