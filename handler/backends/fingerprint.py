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


# MLAS's int8 kernels that add u8 x s8 products in int32 (vpdpbusd, tdpbusd). Without one, x86 MLAS pairs them in
# int16 (vpmaddubsw), which saturates on 8-bit weights: answers the pack's gate never saw (MiniLM min cosine 0.969
# vs 0.986 measured on an AVX2 host). Arm's dot-product kernels accumulate in int32.
INT32_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_refusal(quantization: object, machine: str | None = None, flags: set[str] | None = None) -> str | None:
    """Why this CPU cannot serve an int8 pack as its gate measured it, or None: 8-bit weights through
    MatMulIntegerToFloat on an x86 CPU without an int32 dot product (`INT32_DOT_FLAGS`)."""
    if not isinstance(quantization, dict) or quantization.get("operator") != "MatMulIntegerToFloat":
        return None
    bits = quantization.get("weight_bits", 7)  # packs before the field: 7-bit weights
    if not isinstance(bits, int) or bits < 8:
        return None
    machine = (machine or os.uname().machine).lower()
    if machine not in ("x86_64", "amd64", "i686", "x86"):
        return None
    have = cpu_flags() if flags is None else flags
    if have & set(INT32_DOT_FLAGS):
        return None
    return (
        f"this int8 pack's {bits}-bit weights need an x86 CPU with {' or '.join(INT32_DOT_FLAGS)} (MLAS adds "
        "u8 x s8 pairs in int16 without one and saturates: answers its quality gate never measured); this CPU "
        "has none: serve the float32 pack, or pack --quantize int8-block for it"
    )
