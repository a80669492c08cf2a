"""`make compat`: optimum-onnx loads lpes's ONNX folder unchanged and generates lpes's tokens.

Run in the second venv (.venv-compat: optimum-onnx 0.1.0, transformers < 4.58, no lpes).
Loads the folder exactly as an optimum user does, `ORTModelForCausalLM.from_pretrained`
and `AutoTokenizer.from_pretrained`, checks that the tokenizer gives lpes's token ids and
only the inputs `generate` takes, then compares `generate(**encoded)` with the reference's
greedy tokens (compat/expected_tokens.py), one prompt at a time and as one left-padded
batch, up to the first step where the reference's top two logits are within NEAR_TIE.

    python compat/check_optimum.py OUT_DIR/onnx EXPECTED.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NEAR_TIE = 1e-3  # logits closer than this may swap order between two correct runtimes


def compared_steps(row: dict) -> int:
    """Steps before the reference's first near-tie: there every correct runtime picks the same token."""
    return next((step for step, margin in enumerate(row["margins"]) if margin < NEAR_TIE), len(row["tokens"]))


def check(label: str, got: list[int], row: dict) -> bool:
    n = compared_steps(row)
    ok = got[:n] == row["tokens"][:n]
    print(f"  {label}: {len(row['input_ids'])} prompt tokens, optimum {got}, lpes {row['tokens']}, "
          f"{n} steps compared: {'same' if ok else 'DIFFERENT'}")
    return ok


def main() -> int:
    import transformers
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    onnx_dir, expected_file = Path(sys.argv[1]), Path(sys.argv[2])
    expected = json.loads(expected_file.read_text())
    print(f"transformers {transformers.__version__}, optimum-onnx ORTModelForCausalLM on {onnx_dir}")
    tokenizer = AutoTokenizer.from_pretrained(onnx_dir)
    model = ORTModelForCausalLM.from_pretrained(onnx_dir)
    new = expected["max_new_tokens"]
    ok = True
    for i, row in enumerate(expected["rows"]):
        encoded = tokenizer(row["prompt"], return_tensors="pt")
        if sorted(encoded) != ["attention_mask", "input_ids"] or encoded["input_ids"][0].tolist() != row["input_ids"]:
            print(f"  prompt {i}: the tokenizer gives {sorted(encoded)} / other ids than lpes's tokenizer")
            ok = False
            continue
        out = model.generate(**encoded, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        ok &= check(f"prompt {i}", out[0, encoded["input_ids"].shape[1]:].tolist(), row)
    batch = tokenizer([row["prompt"] for row in expected["rows"]], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    for i, row in enumerate(expected["rows"]):
        ok &= check(f"batch row {i} (left-padded)", out[i, batch["input_ids"].shape[1]:].tolist(), row)
    print("make compat: OK, optimum-onnx gives lpes's tokens" if ok else "make compat: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
