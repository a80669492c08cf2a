"""The NVIDIA GPU this machine has, asked of the CUDA driver itself (libcuda), not of a framework.

torch, onnxruntime-gpu and tensorrt can each be installed on a machine without a GPU (and
onnxruntime-gpu lists its CUDA provider there all the same), so lpes asks the driver: no
libcuda, or a driver that reports no device, means no GPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

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
