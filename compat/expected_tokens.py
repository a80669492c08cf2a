"""lpes's own greedy tokens for `make compat`: the PyTorch reference on the bundled model.

Run with lpes's venv (transformers 5). Writes the prompts, their token ids as lpes's
tokenizer gives them, the greedy continuation of each prompt by the reference
(`lpes.apply` on the base model, the spec of the converted folder) and, per step, the
margin between the best and second-best logit, so that the check in the other venv can
stop comparing at a near-tie instead of failing on float noise.

    python compat/expected_tokens.py OUT_DIR EXPECTED.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import lpes
from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.foundation.spec import load_spec
from lpes.validation.tiny_kv import make_examples

MAX_NEW_TOKENS = 8
# Past the 256 positions the bundled model was trained on, where the scales matter.
PROMPT_LENGTHS = (600, 300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="an lpes-convert output folder (lpes_spec.json, onnx/)")
    parser.add_argument("expected", type=Path, help="where to write the expected tokens (JSON)")
    args = parser.parse_args()

    spec = load_spec(args.out_dir / "lpes_spec.json")
    model_path = resolve_model(spec.provenance["base_model"])
    model = lpes.apply(load_model(model_path), spec)
    tokenizer = load_tokenizer(args.out_dir / "onnx")
    prompts = [make_examples(16, length, [4], 1, seed=length)[0].prompt for length in PROMPT_LENGTHS]
    rows = []
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        tokens, margins = greedy(model, ids, MAX_NEW_TOKENS)
        rows.append({"prompt": prompt, "input_ids": ids, "tokens": tokens, "margins": margins})
    args.expected.write_text(json.dumps({"max_new_tokens": MAX_NEW_TOKENS, "rows": rows}) + "\n")
    print(f"expected tokens of the reference for {len(rows)} prompts -> {args.expected}")


def greedy(model, ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens by full forward passes (no cache: nothing to share with the code under test)."""
    tokens, margins = [], []
    sequence = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(sequence).logits[0, -1].double()
            top = torch.topk(logits, 2)
            tokens.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            sequence = torch.cat([sequence, top.indices[:1][None]], dim=1)
    return tokens, margins


if __name__ == "__main__":
    main()
