"""`make compat`: a Hub folder lpes wrote, loaded by another transformers release, gives lpes's outputs.

Run in a compat venv (.venv-compat-<version>: CPU torch and one transformers release, no
lpes). Loads each folder of REFERENCE.json (compat/reference_outputs.py) exactly as a user or
a runtime does, and compares with the reference lpes computed in its own venv:

- the tokenizer (`AutoTokenizer`) gives lpes's token ids;
- `AutoModelForCausalLM.from_pretrained` (trust_remote_code=True for a custom-code folder,
  nothing for a stock-RoPE one) gives the reference's logits within the tolerance;
- `AutoModel` gives the base model's last hidden state (vLLM's Transformers backend builds
  `auto_map["AutoModel"]` and adds its own head);
- a custom-code folder refuses to load without trust_remote_code, instead of running the
  unscaled model.

Prints one line per check and writes RESULT.json (transformers version, each check's verdict).

    python compat/check_hub.py REFERENCE.json RESULT.json
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path


def main() -> int:
    sys.modules["lpes"] = None  # the folder must not need lpes, even where it is installed: import lpes fails
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()  # load reports (the base model's unused lm_head) are not results
    reference_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    meta = json.loads(reference_file.read_text())
    arrays = np.load(reference_file.with_suffix(".npz"))
    tolerance = meta["tolerance"]
    result = {"transformers": transformers.__version__, "torch": torch.__version__, "tolerance": tolerance,
              "checks": {}}
    print(f"transformers {transformers.__version__}, torch {torch.__version__} (lpes's reference: transformers "
          f"{meta['transformers']})")

    def check(name: str, run) -> None:
        try:
            ok, detail = run()
        except Exception as err:  # a load or forward that fails is this row's result, not the script's
            ok, detail = False, f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err) else ''}"
            traceback.print_exc(limit=3)
        result["checks"][name] = {"ok": bool(ok), "detail": detail}
        print(f"  {name}: {'ok' if ok else 'FAILED'} ({detail})", flush=True)

    for name, folder_meta in meta["folders"].items():
        folder = folder_meta["path"]
        trust = {"trust_remote_code": True} if folder_meta["custom_code"] else {}

        def tokenizer_ids(folder=folder, trust=trust, rows=folder_meta["rows"]):
            tokenizer = AutoTokenizer.from_pretrained(folder, **trust)
            same = all(tokenizer(row["prompt"])["input_ids"] == row["input_ids"] for row in rows)
            return same, f"{type(tokenizer).__name__}, {'the same' if same else 'other'} token ids"

        def outputs(auto, what, folder=folder, trust=trust, name=name, rows=folder_meta["rows"],
                    moved=folder_meta["unscaled_max_abs"]):
            model = auto.from_pretrained(folder, dtype=torch.float32, **trust).eval()
            errors = []
            for i, row in enumerate(rows):
                with torch.no_grad():
                    out = model(torch.tensor([row["input_ids"]]))
                got = (out.logits if what == "logits" else out.last_hidden_state)[0].float().numpy()
                want = arrays[f"{name}.{i}.{'logits' if what == 'logits' else 'hidden'}"]
                errors.append(float(np.abs(got - want).max()) if got.shape == want.shape else float("inf"))
            lengths = ", ".join(str(len(r["input_ids"])) for r in rows)
            context = f"; the unscaled model's: {moved:.1e}" if what == "logits" else ""
            return max(errors) <= tolerance, (f"{type(model).__name__}, max |{what} - lpes| {max(errors):.1e} "
                                              f"over prompts of {lengths} tokens{context}")

        check(f"{name}: AutoTokenizer", tokenizer_ids)
        check(f"{name}: AutoModelForCausalLM", lambda f=outputs: f(AutoModelForCausalLM, "logits"))
        check(f"{name}: AutoModel", lambda f=outputs: f(AutoModel, "last hidden state"))
        if folder_meta["custom_code"]:
            def refuses(folder=folder):
                try:
                    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
                except (ValueError, OSError, KeyError) as err:
                    return True, f"refused: {type(err).__name__}"
                return False, "loaded without trust_remote_code (it would run the unscaled model)"

            check(f"{name}: refused without trust_remote_code", refuses)
    result_file.write_text(json.dumps(result, indent=1) + "\n")
    passed = all(c["ok"] for c in result["checks"].values())
    print(f"transformers {transformers.__version__}: {'OK' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
