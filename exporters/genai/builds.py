"""What onnxruntime-genai's builder builds: execution provider -> the precisions it accepts for it (its own list,
TensorRT-RTX left out). A module of its own, torch-free: lpes-convert's parser reads the choices (target.py), so a
mistyped flag is refused in a second, and the package writer checks them (package.py); neither imports the other.
Only cpu fp32 and int4 have been run by lpes; the others go through the same cache checks."""

from __future__ import annotations

BUILDS: dict[str, tuple[str, ...]] = {
    "cpu": ("fp32", "int8", "int4"),
    "cuda": ("fp32", "fp16", "bf16", "int8", "int4"),
    "dml": ("fp16", "int4"),
    "webgpu": ("int8", "int4"),
}
