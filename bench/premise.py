"""The premise, decided prompt by prompt: held-out accuracy of each variant, all positions and the middle.

    .venv/bin/python bench/premise.py bench/real/position.json:20 "stock YaRN=bench/real/compare-yarn.json" ...

Each argument is `[LABEL=]FILE`, a file of per-prompt answers on the same held-out prompts (bench_real_model.py's
`compare` output, or `position.json:PAIRS` for its unscaled row at that pair count), in the same
order. The middle is the gold positions at 25-75% of the context (gold index / (pairs - 1)). Each
variant is held against the best of the others, on all prompts and on the middle ones (the best by
accuracy there), with McNemar's exact test: the two-sided binomial p of the discordant prompts
(right with one, wrong with the other).
"""

from __future__ import annotations

import json
import sys
from math import comb
from pathlib import Path


def load(argument: str) -> tuple[str, list[dict]]:
    label, _, path = argument.rpartition("=")
    path, _, pairs = path.partition(":")
    data = json.loads(Path(path).read_text())
    if pairs:
        row = next(r for r in data if r["pairs"] == int(pairs))
        return label or "unscaled", row["answers"]
    return label or data["variant"], data["answers"]


def mcnemar_p(a: list[bool], b: list[bool]) -> tuple[int, int, float]:
    """(right only with a, right only with b, exact two-sided p)."""
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    n = only_a + only_b
    if n == 0:
        return 0, 0, 1.0
    tail = sum(comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return only_a, only_b, min(1.0, 2 * tail)


def middle(answers: list[dict]) -> list[bool]:
    last = max(a["gold_index"] for a in answers)
    return [0.25 <= a["gold_index"] / last <= 0.75 for a in answers]


def against_best(name: str, verdicts: dict[str, list[bool]]) -> str:
    """`name` against the best of the other variants on these verdicts: discordant prompts and McNemar's p."""
    best = max((o for o in verdicts if o != name), key=lambda o: sum(verdicts[o]))
    only, other, p = mcnemar_p(verdicts[name], verdicts[best])
    return f"vs {best[:30]}: {only} / {other}, p = {p:.3g}"


def main(arguments: list[str]) -> int:
    variants = [load(a) for a in arguments]
    values = [[a["value"] for a in answers] for _, answers in variants]
    if any(v != values[0] for v in values):
        raise SystemExit("the files do not hold the same prompts in the same order")
    in_middle = middle(variants[0][1])
    verdicts = {name: [a["correct"] for a in answers] for name, answers in variants}
    mid = {name: [ok for ok, m in zip(v, in_middle) if m] for name, v in verdicts.items()}
    print(f"| variant | all ({len(in_middle)}) | all vs best other (only this / only other, McNemar p) | "
          f"middle 25-75% ({sum(in_middle)}) | middle vs best other |")
    print("|---|---:|---|---:|---|")
    for name in verdicts:
        print(f"| {name[:60]} | {100 * sum(verdicts[name]) / len(in_middle):.1f} | {against_best(name, verdicts)} | "
              f"{100 * sum(mid[name]) / len(mid[name]):.1f} | {against_best(name, mid)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
