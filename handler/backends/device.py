"""Is a CUDA device usable? Decided once per instance, cheaply, with the reason recorded when not.

Asking ONNX Runtime for the CUDA provider on a machine without a driver logs an error and silently
falls back; asking torch imports and initializes a lot. The driver API via ctypes answers in microseconds.
"""

from __future__ import annotations

import ctypes

from handler.core.records import field, record


@record
class CudaProbe:
    usable: bool
    reason: str
    devices: list[str] = field(default_factory=list)


def probe_cuda(mode: str = "auto") -> CudaProbe:
    if mode == "cpu":
        return CudaProbe(False, "WARMSTART_DEVICE=cpu")
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return CudaProbe(False, f"no NVIDIA driver: libcuda.so.1 not loadable ({e})")
    rc = lib.cuInit(0)
    if rc != 0:
        return CudaProbe(False, f"cuInit failed with CUresult {rc} (no device visible or driver error)")
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return CudaProbe(False, "driver loaded but no CUDA device visible")
    names = []
    for i in range(count.value):
        dev, buf = ctypes.c_int(0), ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceGetName(buf, 256, dev) == 0:
            names.append(buf.value.decode(errors="replace"))
    return CudaProbe(True, f"{count.value} CUDA device(s)", names)
