"""lpes's reference outputs for the Hub folder rows of `make compat` (run with lpes's own venv).

For each Hub folder given (`NAME=DIR`, written by lpes-convert --to hf), the PyTorch
reference (`lpes.apply` on the base model with the folder's lpes_spec.json) is run on two
prompts past the 256 positions the bundled model was trained on, where the scales matter.
Writes `OUT.npz` (per folder and prompt: the logits, and the base model's last hidden state,
what vLLM's Transformers backend takes from `AutoModel`) and `OUT.json` (the prompts, their
token ids as lpes's tokenizer gives them, how each folder must load, the tolerance), which
compat/check_hub.py reads in a venv with another transformers and no lpes.

    python compat/reference_outputs.py custom=OUT/hub-custom stock=OUT/hub-stock OUT/reference
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import transformers

import lpes
from lpes.converter.loading import load_model, load_tokenizer, resolve_model
from lpes.foundation.spec import load_spec
from lpes.validation.tiny_kv import make_examples

# float32 on the CPU: two correct transformers releases agree far closer than this; a RoPE or
# loading difference (a scale not applied, another rope_type) moves logits by 1e-2 or more.
TOLERANCE = 1e-5
PROMPT_LENGTHS = (600, 300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="NAME=DIR, a Hub folder lpes-convert wrote")
    parser.add_argument("out", type=Path, help="OUT: writes OUT.json and OUT.npz")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = [make_examples(16, length, [4], 1, seed=length)[0].prompt for length in PROMPT_LENGTHS]
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "tolerance": TOLERANCE,
            "folders": {}}
    arrays = {}
    for item in args.folders:
        name, folder = item.split("=", 1)
        folder = Path(folder)
        spec = load_spec(folder / "lpes_spec.json")
        config = json.loads((folder / "config.json").read_text())
        custom = bool(json.loads((Path(folder) / "config.json").read_text()).get("auto_map"))  # LPES code
        base = resolve_model(spec.provenance["base_model"])
        unscaled = load_model(base).eval()
        model = lpes.apply(load_model(base), spec).eval()
        tokenizer = load_tokenizer(folder)
        rows, moved = [], 0.0
        for i, prompt in enumerate(prompts):
            ids = tokenizer(prompt)["input_ids"]
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_hidden_states=True)
                plain = unscaled(torch.tensor([ids])).logits
            arrays[f"{name}.{i}.logits"] = out.logits[0].float().numpy()
            arrays[f"{name}.{i}.hidden"] = out.hidden_states[-1][0].float().numpy()
            moved = max(moved, float((plain - out.logits).abs().max()))
            rows.append({"prompt": prompt, "input_ids": ids})
        # How far the unscaled model is: a folder that silently ignored its scales would be this far off.
        meta["folders"][name] = {"path": str(folder), "custom_code": custom, "scales": spec.scales,
                                 "model_type": config["model_type"], "unscaled_max_abs": moved, "rows": rows}
        print(f"reference outputs of {folder} ({'custom code' if custom else 'stock RoPE'}, scales "
              f"{', '.join(f'{s:g}' for s in spec.scales)}; the unscaled model's logits differ by up to {moved:.2g})")
    np.savez_compressed(args.out.with_suffix(".npz"), **arrays)
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
