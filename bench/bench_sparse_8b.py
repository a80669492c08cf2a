"""lpes-convert --to hf on a Llama-3-8B-shaped checkpoint that occupies almost no disk.

The checkpoint is real safetensors (a valid header for every tensor of Llama 3 8B, bfloat16,
four shards and an index) whose data is a hole: each shard is truncated to its full size,
so 16 GB of weights read as zeros and take no blocks. No tokenizer files, as in many
weights-only repositories. The conversion must be metadata work: hard links, seconds, and
a peak RSS far below the weights, with the output saying which checks ran.

    python bench/bench_sparse_8b.py [--keep DIR]

Prints wall time, peak RSS (from /usr/bin/time -v, else getrusage of the child) and
whether the weights were hard-linked; exits 1 when a target (30 s, 3 GB) is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}
MAX_SECONDS, MAX_RSS = 30.0, 3e9


def tensor_shapes(c: dict) -> dict[str, list[int]]:
    h, i, v, kv = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_key_value_heads"]
    kv_dim = kv * h // c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv_dim, h],
                   p + "self_attn.v_proj.weight": [kv_dim, h], p + "self_attn.o_proj.weight": [h, h],
                   p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                   p + "mlp.down_proj.weight": [h, i], p + "input_layernorm.weight": [h],
                   p + "post_attention_layernorm.weight": [h]}
    return shapes


def write_sparse_checkpoint(folder: Path, config: dict, shards: int = 4) -> int:
    """Safetensors shards with real headers and holes for data; returns the weight bytes."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    names = list(tensor_shapes(config).items())
    per_shard = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in names[s * per_shard:(s + 1) * per_shard]:
            size = 2 * math.prod(shape)  # bfloat16
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            weight_map[name] = file
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with open(folder / file, "wb") as handle:
            handle.write(len(blob).to_bytes(8, "little") + blob)
            handle.truncate(8 + len(blob) + offset)  # a hole: no blocks written
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def run_measured(argv: list[str]) -> tuple[int, float, float, str]:
    """(exit status, wall seconds, peak RSS bytes, stderr) of one command."""
    timed = ["/usr/bin/time", "-v", *argv] if Path("/usr/bin/time").is_file() else argv
    start = time.perf_counter()
    proc = subprocess.run(timed, capture_output=True, text=True)
    wall = time.perf_counter() - start
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    rss = int(match.group(1)) * 1024 if match else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return proc.returncode, wall, rss, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the checkpoint and output here and keep them")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="lpes-8b-"))
    try:
        base = work / "llama3-8b-shaped"
        size = write_sparse_checkpoint(base, LLAMA3_8B)
        used = sum(p.stat().st_blocks * 512 for p in base.iterdir())
        print(f"checkpoint: {size / 1e9:.1f} GB of bfloat16 weights in 4 shards, {used / 1e6:.1f} MB on disk")
        spec = work / "spec.json"
        spec.write_text(json.dumps({"curve": {"control_points": [[0, 4.0], [1, 1.5], [2, 1.0], [3, 1.0]]}}))
        out = work / "out"
        lpes_convert = str(Path(sys.executable).with_name("lpes-convert"))
        status, wall, rss, text = run_measured([lpes_convert, str(base), "--curve", str(spec), "--to", "hf",
                                                "--out", str(out)])
        print("\n".join(line for line in text.splitlines() if "Command being timed" not in line
                        and not line.startswith("\t")))
        linked = all(os.path.samefile(out / p.name, p) for p in base.glob("*.safetensors"))
        print(f"exit {status}; wall {wall:.1f} s; peak RSS {rss / 1e9:.2f} GB; weights hard-linked: {linked}")
        ok = status == 0 and wall < MAX_SECONDS and rss < MAX_RSS and linked
        print("targets (< 30 s, < 3 GB, linked):", "met" if ok else "MISSED")
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
