"""The recipe that builds an engine on another machine: `trtexec.sh` and `README.md`.

Written next to every engine (and instead of one where this machine cannot build): an
engine runs only on the GPU model and TensorRT version that built it, so the folder
carries the equivalent trtexec command line, every input's min/opt/max shape included.
Paths are relative to the engine folder, so the output folder can be moved or copied.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from lpes.exporters.tensorrt.build import BuildPlan
from lpes.exporters.tensorrt.profiles import trtexec_shape_flags
from lpes.foundation.files import write_text_atomic

ENGINE_FILE = "model.engine"
SIDECAR_FILE = "model.engine.json"
TIMING_CACHE_FILE = "timing.cache"
TRTEXEC_FILE = "trtexec.sh"
README_FILE = "README.md"


def trtexec_command(
    onnx_path: str, shapes: dict, plan: BuildPlan, workspace_bytes: int | None = None
) -> list[str]:
    """The trtexec command line equivalent to the Python build (paths relative to the engine folder)."""
    command = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={ENGINE_FILE}"]
    command.append(f"--timingCacheFile={TIMING_CACHE_FILE}")
    if plan.strongly_typed:
        command.append("--stronglyTyped")  # needed on TensorRT 10, a no-op on 11
    command += [f"--{flag.lower()}" for flag in plan.set_flags]  # --fp16 / --bf16 (TensorRT 10 only)
    if "TF32" in plan.clear_flags:
        command.append("--noTF32")
    if workspace_bytes:
        command.append(f"--memPoolSize=workspace:{max(1, workspace_bytes >> 20)}M")
    command += trtexec_shape_flags(shapes)
    command.append("--skipInference")
    return command


def pretty(command: list[str]) -> str:
    return " \\\n    ".join(shlex.quote(part) for part in command)


def write_recipe(out_dir: Path, command: list[str], dtype: str, missing: str | None, onnx_rel: str) -> None:
    script = (
        "#!/bin/sh\n"
        "# Builds model.engine for the GPU of the machine that runs this, with TensorRT >= 10.\n"
        "# An engine is tied to its GPU model and TensorRT version: rebuild it for every other.\n"
        "set -e\n"
        'cd "$(dirname "$0")"\n'
        f"{pretty(command)}\n"
    )
    path = out_dir / TRTEXEC_FILE
    write_text_atomic(path, script)
    path.chmod(0o755)
    write_text_atomic(out_dir / README_FILE, _readme(dtype, missing, onnx_rel))
    (out_dir / README_FILE).chmod(0o644)


def _readme(dtype: str, missing: str | None, onnx_rel: str) -> str:
    status = (
        f"`{ENGINE_FILE}` was built on the machine that ran lpes-convert (see `{SIDECAR_FILE}`)."
        if missing is None
        else f"No engine was built here: this machine lacks {missing}."
    )
    return f"""# TensorRT engine ({dtype})

**Experimental: never built here.** lpes's TensorRT path has not yet built or run an engine on
any machine of the lpes project (none can install TensorRT); its API use was checked against
the TensorRT 11.4 Python bindings. Check the engine's answers (lpes-validate) before relying on it.

{status}

A TensorRT engine runs only on the GPU model and the TensorRT version that built it.
Build it on the deployment machine (NVIDIA GPU, TensorRT >= 10), from this folder, either:

    sh {TRTEXEC_FILE}

(trtexec, the command line shipped with TensorRT; the script lists every input's
min/opt/max shape, so the KV cache inputs `past_key_values.*` are covered), or, with lpes
and the tensorrt Python package installed, which also writes the sidecar `{SIDECAR_FILE}`:

    python -m lpes.exporters.tensorrt {shlex.quote(onnx_rel)} . --dtype {dtype}

Then generate with the engine and its KV cache:

    from lpes.exporters.tensorrt.runner import TrtCausalLM
    TrtCausalLM(".").greedy([[1, 2, 3]], max_new_tokens=16)
"""


