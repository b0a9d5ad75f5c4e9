"""What pre-optimized ONNX Runtime files are tied to: the machine architecture and the CPU features MLAS picks
its kernels (and so its prepacked weight layouts) by. Stdlib only: the prefetch thread reads it before numpy
and ONNX Runtime are imported.
"""

from __future__ import annotations

import os

# The /proc/cpuinfo flags that change MLAS's kernel choice (x86: SSE4 → AVX → AVX2/FMA → AVX-512 → VNNI/BF16/
# AMX; Arm: NEON dot product, SVE, i8mm, bf16). Flags outside this list (hypervisor, rdrand...) do not, and
# leaving them out keeps a prepacked model valid across hosts that differ only in those.
KERNEL_FLAGS = (
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "i8mm",
    "bf16",
)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags (x86 `flags`, Arm `Features`); reads only up to the first blank line."""
    if cpuinfo is None:
        lines = []
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if not line.strip():
                        break
                    lines.append(line)
        except OSError:
            return set()
        cpuinfo = "".join(lines)
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_fingerprint(cpuinfo: str | None = None) -> dict[str, object]:
    flags = cpu_flags(cpuinfo)
    return {"arch": os.uname().machine, "cpu_features": sorted(f for f in KERNEL_FLAGS if f in flags)}
