"""What the two bundled-model training scripts share: saving a model folder, and the run itself.

`train_tiny_kv.py` and `train_tiny_induction.py` each define their task, model, training loop
and evaluation; this module holds the parts that are the same for both, so that a change to
how a bundled model is saved or reported is made once.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
MAX_MODEL_MB = 20  # a bundled model ships inside the package


def base_parser(doc: str, out: str, steps: int, threads: int, report: str) -> argparse.ArgumentParser:
    """The flags both scripts take; each adds its own after these."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    # The thread count is part of what makes a run repeat bit for bit.
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--eval-examples", type=int, default=40, help="examples per gold index and cell")
    parser.add_argument("--eval-only", action="store_true", help="skip training; evaluate the saved --out")
    parser.add_argument("--report", type=Path, default=ROOT / "demo" / report)
    return parser


def save_model_folder(model: LlamaForCausalLM, out: Path, tokenizer, generation: GenerationConfig,
                      task: dict, readme: str) -> None:
    """Weights (float32), tokenizer, generation config, lpes_task.json and README.md into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(out)
    # safetensors writes 0600; the folder is shipped as package data, so make it readable.
    (out / "model.safetensors").chmod(0o644)
    tokenizer.save_pretrained(out)
    generation.save_pretrained(out)
    (out / "lpes_task.json").write_text(json.dumps(task) + "\n")
    (out / "README.md").write_text(readme)


def run(
    args: argparse.Namespace,
    train: Callable[[argparse.Namespace], LlamaForCausalLM],
    save: Callable[[LlamaForCausalLM, Path, argparse.Namespace], None],
    evaluate: Callable[[Path, int], str],
    write_report: Callable[[Path, str, argparse.Namespace, float | None], None],
) -> None:
    """Train and save (unless --eval-only), then evaluate the saved folder and write the report."""
    torch.set_num_threads(args.threads)
    out = args.out if args.out.is_absolute() else ROOT / args.out
    wall_s = None
    if not args.eval_only:
        start = time.time()
        model = train(args)
        wall_s = time.time() - start
        save(model, out, args)
        size_mb = (out / "model.safetensors").stat().st_size / 2**20
        print(f"saved {out} (model.safetensors {size_mb:.1f} MiB)", flush=True)
        if size_mb > MAX_MODEL_MB:
            raise SystemExit(f"model.safetensors is over the {MAX_MODEL_MB} MB budget")
    table = evaluate(out, args.eval_examples)
    print(table)
    write_report(args.report, table, args, wall_s)
