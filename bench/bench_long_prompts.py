"""Peak memory of default validation on 5-6k-token prompts: a real byte-level BPE tokenizer.

A tiny random Llama (4 layers, hidden 128) gets a byte-level BPE tokenizer trained here,
offline, with `tokenizers` on text of the benchmark's kind (UUID key-value JSON), so the
default `kv` task (75 pairs, the benchmark's prompt) gives prompts of about 5-6k tokens,
as a real Llama tokenizer does. Then `lpes-convert --to hf,onnx` with default flags runs
the reference, the Hub folder and the ONNX export on those prompts; its peak RSS must stay
under 6 GB (main once measured 22 GB here, killed by the OOM killer, with batches of 8).

    python bench/bench_long_prompts.py [--keep DIR] [--to hf,onnx]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_sparse_8b import run_measured  # noqa: E402

MAX_RSS = 6e9


def train_tokenizer(folder: Path) -> None:
    """Byte-level BPE on benchmark-like text, saved as a transformers tokenizer.

    Vocabulary 270 (256 bytes and a few merges) gives about 5.7k tokens per 75-pair prompt,
    what Llama 2's tokenizer gives on the benchmark.
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from lpes.validation import kv_data

    records = kv_data.generate_records(75, 40, seed=12345)  # not the seeds search or validation use
    corpus = [kv_data.kv_prompt(r) for r in records]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=270, min_frequency=2, special_tokens=["<s>", "</s>", "<pad>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.save_pretrained(folder)


def write_model(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=270, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    LlamaForCausalLM(config).save_pretrained(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the model and output here and keep them")
    parser.add_argument("--to", default="hf,onnx")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="lpes-long-"))
    try:
        base = work / "tiny-llama-bpe"
        write_model(base)
        train_tokenizer(base)
        from transformers import AutoTokenizer

        from lpes.validation.tasks import load_examples

        tokenizer = AutoTokenizer.from_pretrained(base)
        lengths = [len(tokenizer(e.prompt)["input_ids"]) for e in load_examples(base, None, tokenizer=tokenizer)]
        print(f"default kv task: {len(lengths)} prompts of {min(lengths)}-{max(lengths)} tokens")
        spec = work / "spec.json"
        spec.write_text(json.dumps({"scales": [2.0, 1.5, 1.0, 1.0]}))
        lpes_convert = str(Path(sys.executable).with_name("lpes-convert"))
        status, wall, rss, text = run_measured([lpes_convert, str(base), "--curve", str(spec), "--to", args.to,
                                                "--out", str(work / "out")])
        print("\n".join(line for line in text.splitlines() if line.startswith(("|", "-", "lpes-convert", "**"))))
        print(f"exit {status}; wall {wall:.0f} s; peak RSS {rss / 1e9:.2f} GB (target < {MAX_RSS / 1e9:.0f} GB)")
        return 0 if status == 0 and rss < MAX_RSS else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
