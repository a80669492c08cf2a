"""TensorRT engines from the ONNX export (`lpes-convert --to tensorrt`).

An engine is the ONNX export compiled for one GPU model by one TensorRT version: it runs
with no plugin and no custom code (the per-layer RoPE scales are constants of the graph),
but only on that GPU model and that TensorRT version. So this folder always carries the
recipe to rebuild it (`trtexec.sh`), and the engine only where this machine can build it.

In order:

1. CPU checks, before anything needs a GPU: the folder is an lpes ONNX export; every
   operator and data type is one TensorRT's ONNX parser reads (`tensorrt_ops`); the
   optimization profile fits the model's positions (`tensorrt_profiles`).
2. The graph TensorRT gets: the export itself when its dtype is the one asked for, else a
   float16/bfloat16 copy of the float32 export (`tensorrt_cast`), written here.
3. `trtexec.sh` and `README.md`: the equivalent trtexec command line (every input's
   min/opt/max shape, the timing cache, strong typing).
4. Where the machine has TensorRT >= 10 and an NVIDIA GPU: build (`tensorrt_build`) and
   write `model.engine`, `timing.cache` and the sidecar `model.engine.json` (TensorRT
   version, GPU and compute capability, profile, I/O names, the spec). Elsewhere: no engine,
   and a one-line note of exactly what is missing (lpes-convert prints it and exits 2).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from lpes.errors import LpesError
from lpes.exporters.onnx_export import MODEL_FILE, SPEC_FILE, read_metadata
from lpes.exporters.tensorrt_build import (
    BuildPlan,
    build_plan,
    build_serialized_engine,
    gpu_info,
    missing_requirements,
    tensorrt_version,
)
from lpes.exporters.tensorrt_ops import check_tensorrt_support
from lpes.exporters.tensorrt_profiles import Profile, default_profile, input_shapes, trtexec_shape_flags
from lpes.spec import write_text_atomic

ENGINE_FILE = "model.engine"
SIDECAR_FILE = "model.engine.json"
TIMING_CACHE_FILE = "timing.cache"
TRTEXEC_FILE = "trtexec.sh"
README_FILE = "README.md"
FORMAT = "lpes-tensorrt"
VERSION = 1


def build_engine_or_explain(
    onnx_dir: Path,
    out_dir: Path,
    dtype: str,
    profile: Profile | None = None,
    *,
    timing_cache: Path | None = None,
    workspace_bytes: int | None = None,
    typing: str = "strong",
) -> str | None:
    """Build `out_dir/model.engine` from the export in `onnx_dir`; None on success.

    Where this machine cannot build (no tensorrt package, no NVIDIA GPU) it builds nothing,
    leaves `trtexec.sh` and `README.md` in `out_dir`, prints the trtexec command to stderr
    and returns a one-line note saying what is missing. Raises LpesError for a graph or
    profile TensorRT could not take anywhere. `timing_cache` (default `out_dir/timing.cache`)
    is read if present and updated after the build; `typing="weak"` is TensorRT 10's
    builder-flag precision (see `tensorrt_build`).
    """
    onnx_dir, out_dir = Path(onnx_dir), Path(out_dir)
    metadata = read_metadata(onnx_dir)
    check_tensorrt_support(onnx_dir / MODEL_FILE)
    profile = profile or default_profile(max_positions(onnx_dir))
    missing = missing_requirements()
    # Without TensorRT here its version is unknown: the plan for 10 builds on 10 and 11 alike.
    plan = build_plan(tensorrt_version() if missing is None else "10", dtype, typing)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_file = engine_onnx(onnx_dir, metadata["dtype"], plan.onnx_dtype, out_dir)
    shapes = input_shapes(graph_input_dims(onnx_file), profile)
    command = trtexec_command(os.path.relpath(onnx_file, out_dir), shapes, plan, workspace_bytes)
    _write_recipe(out_dir, command, dtype, missing)
    if missing is not None:
        where = f"build the engine in {out_dir.name}/ on the deployment machine with"
        print(f"{where}:\n{_pretty(command)}", file=sys.stderr)
        return (
            f"TensorRT engine not built: this machine lacks {missing}; the ONNX export is in place, "
            f"and {out_dir.name}/{TRTEXEC_FILE} builds the engine on a machine with both "
            f"(see {out_dir.name}/{README_FILE})"
        )
    cache = Path(timing_cache) if timing_cache else out_dir / TIMING_CACHE_FILE
    serialized = build_serialized_engine(onnx_file, shapes, plan, cache, workspace_bytes)
    _write_engine(out_dir / ENGINE_FILE, serialized)
    sidecar = _sidecar(onnx_dir, onnx_file, out_dir, metadata, dtype, profile, shapes, plan, cache)
    write_text_atomic(out_dir / SIDECAR_FILE, json.dumps(sidecar, indent=2) + "\n")
    return None


def max_positions(onnx_dir: Path) -> int:
    """`max_position_embeddings` from the export's config.json (or its text_config)."""
    path = Path(onnx_dir) / "config.json"
    if not path.is_file():
        raise LpesError(f"{onnx_dir} has no config.json to read max_position_embeddings from")
    config = json.loads(path.read_text())
    value = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    if not isinstance(value, int) or value < 1:
        raise LpesError(f"{path} has no max_position_embeddings; pass the profile (--max-total) explicitly")
    return value


def engine_onnx(onnx_dir: Path, export_dtype: str, wanted: str, out_dir: Path) -> Path:
    """The graph TensorRT builds: the export itself, or its `wanted` cast written into `out_dir`."""
    if export_dtype == wanted:
        return Path(onnx_dir) / MODEL_FILE
    if export_dtype != "float32":
        raise LpesError(
            f"the ONNX export in {onnx_dir} is {export_dtype}; a {wanted} engine needs a {wanted} "
            "or a float32 export to cast from"
        )
    from lpes.exporters.tensorrt_cast import write_cast_onnx

    cast = write_cast_onnx(Path(onnx_dir) / MODEL_FILE, Path(out_dir) / f"model.{wanted}.onnx", wanted)
    check_tensorrt_support(cast)
    return cast


def graph_input_dims(onnx_file: Path) -> dict[str, list[int | str]]:
    """Each graph input's dims: an int where static, the dimension's name where dynamic."""
    import onnx

    model = onnx.load(str(onnx_file), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    dims = {}
    for value in model.graph.input:
        if value.name in initializers:  # old-style graphs list weights as inputs
            continue
        shape = value.type.tensor_type.shape.dim
        dims[value.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in shape]
    return dims


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


def _pretty(command: list[str]) -> str:
    return " \\\n    ".join(shlex.quote(part) for part in command)


def _write_recipe(out_dir: Path, command: list[str], dtype: str, missing: str | None) -> None:
    script = (
        "#!/bin/sh\n"
        "# Builds model.engine for the GPU of the machine that runs this, with TensorRT >= 10.\n"
        "# An engine is tied to its GPU model and TensorRT version: rebuild it for every other.\n"
        "set -e\n"
        'cd "$(dirname "$0")"\n'
        f"{_pretty(command)}\n"
    )
    path = out_dir / TRTEXEC_FILE
    write_text_atomic(path, script)
    path.chmod(0o755)
    write_text_atomic(out_dir / README_FILE, _readme(dtype, missing))


def _readme(dtype: str, missing: str | None) -> str:
    status = (
        f"`{ENGINE_FILE}` was built on the machine that ran lpes-convert (see `{SIDECAR_FILE}`)."
        if missing is None
        else f"No engine was built here: this machine lacks {missing}."
    )
    return f"""# TensorRT engine ({dtype})

{status}

A TensorRT engine runs only on the GPU model and the TensorRT version that built it.
Build it on the deployment machine (NVIDIA GPU, TensorRT >= 10), from this folder, either:

    sh {TRTEXEC_FILE}

(trtexec, the command line shipped with TensorRT; the script lists every input's
min/opt/max shape, so the KV cache inputs `past_key_values.*` are covered), or, with lpes
and the tensorrt Python package installed, which also writes the sidecar `{SIDECAR_FILE}`:

    python -m lpes.exporters.tensorrt ../onnx . --dtype {dtype}

Then generate with the engine and its KV cache:

    from lpes.validation.trt_runner import TrtCausalLM
    TrtCausalLM(".").greedy([[1, 2, 3]], max_new_tokens=16)
"""


def _write_engine(path: Path, serialized) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(serialized)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _sidecar(onnx_dir, onnx_file, out_dir, metadata, dtype, profile, shapes, plan, cache) -> dict:
    gpu = gpu_info()
    spec_path = Path(onnx_dir) / SPEC_FILE
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "tensorrt": tensorrt_version(),
        "gpu": gpu.to_json() if gpu else None,
        "build": plan.to_json(),
        "onnx": os.path.relpath(onnx_file, out_dir),
        "timing_cache": os.path.relpath(cache, out_dir) if cache.parent == Path(out_dir) else str(cache),
        "profile": profile.to_json(),
        "shapes": {name: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for name, s in shapes.items()},
        "inputs": metadata["inputs"],
        "outputs": metadata["outputs"],
        "num_layers": metadata["num_layers"],
        "num_key_value_heads": metadata["num_key_value_heads"],
        "head_dim": metadata["head_dim"],
        "spec": json.loads(spec_path.read_text()) if spec_path.is_file() else None,
    }


def read_sidecar(engine_dir: Path) -> dict | None:
    """`model.engine.json` of an engine folder, or None (an engine built with trtexec.sh has none)."""
    path = Path(engine_dir) / SIDECAR_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise LpesError(f"{path} is not an lpes TensorRT sidecar")
    return data


def main(argv: list[str] | None = None) -> int:
    """python -m lpes.exporters.tensorrt ONNX_DIR OUT_DIR --dtype D [profile flags]: build on this machine."""
    import argparse

    from lpes.exporters.tensorrt_profiles import add_profile_arguments, profile_from_args

    parser = argparse.ArgumentParser(prog="python -m lpes.exporters.tensorrt", description=main.__doc__)
    parser.add_argument("onnx_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--timing-cache", type=Path, help=f"timing cache (default OUT_DIR/{TIMING_CACHE_FILE})")
    add_profile_arguments(parser)
    args = parser.parse_args(argv)
    try:
        profile = profile_from_args(args, max_positions(args.onnx_dir))
        note = build_engine_or_explain(args.onnx_dir, args.out_dir, args.dtype, profile, timing_cache=args.timing_cache)
    except LpesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if note:
        print(note, file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir / ENGINE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
