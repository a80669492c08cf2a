"""What this machine runs on, decided in one place: its NVIDIA GPU, the torch devices, and sizes in bytes.

`gpu_info` asks the CUDA driver itself (libcuda), not a framework: torch, onnxruntime-gpu and
tensorrt can each be installed on a machine without a GPU (and onnxruntime-gpu lists its CUDA
provider there all the same), so no libcuda, or a driver that reports no device, means no GPU.
`check_device` is every command's --device (default: cuda when there is one, else cpu; `check_device_name`
its spelling alone, before torch loads),
`requested_devices` lpes-search's list of them, `default_dtype` the precision a device gets
by default, and `format_bytes` the one way lpes writes a size (binary units: KiB, MiB, GiB).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from lpes.foundation.errors import LpesError

# CUdevice_attribute values of cuda.h (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR).
_COMPUTE_CAPABILITY_MAJOR, _COMPUTE_CAPABILITY_MINOR = 75, 76


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str

    def to_json(self) -> dict:
        return {"name": self.name, "compute_capability": self.compute_capability}


def gpu_info() -> GpuInfo | None:
    """The first NVIDIA GPU as the CUDA driver sees it, or None when there is no driver or no GPU."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, device = ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None
    if cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return None
    name = ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetName(name, len(name), device)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), _COMPUTE_CAPABILITY_MAJOR, device)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), _COMPUTE_CAPABILITY_MINOR, device)
    return GpuInfo(name.value.decode(errors="replace"), f"{major.value}.{minor.value}")


def check_device_name(name: str | None) -> None:
    """--device as written, without torch (a second, where check_device imports torch): a device type lpes
    runs on, with an optional index. check_device, later, asks the machine whether it has one."""
    if name is None:
        return
    if not re.fullmatch(r"(cpu|cuda|mps)(:[0-9]+)?", name):
        raise LpesError(f"--device {name!r} is not a device lpes runs on (cpu, cuda, cuda:1, mps)")


def check_device(name: str | None) -> str:
    """A torch device this machine has (default: cuda when there is one, else cpu); LpesError otherwise."""
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise LpesError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, mps ...)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise LpesError(f"--device {name}: this machine has no CUDA GPU (or torch is a CPU build)")
        if device.index is not None and device.index >= count:
            raise LpesError(f"--device {name}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise LpesError(f"--device {name}: MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise LpesError(f"--device {name}: lpes runs on cpu, cuda or mps, not {device.type}")
    return str(device)


def default_dtype(device: str) -> str:
    """float32 on a CPU (half-precision matmuls there are slow and inexact); bfloat16 on a GPU that has it."""
    import torch

    if torch.device(device).type == "cpu":
        return "float32"
    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        return "float16"
    return "bfloat16"


def requested_devices(requested: str | None) -> list[str]:
    """The comma-separated devices asked for, else every visible GPU, else the CPU."""
    if requested:
        return [d.strip() for d in requested.split(",") if d.strip()]
    return visible_devices()


def visible_devices() -> list[str]:
    """Every CUDA GPU torch sees, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def format_bytes(size: float) -> str:
    """A size as lpes writes every size: bytes below 1 KiB, else KiB, MiB, GiB or TiB with one decimal."""
    if size < 1024:
        return f"{size:.0f} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"
