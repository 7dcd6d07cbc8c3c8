"""The environment that makes this machine run the kernels of a smaller CPU, so the suite can be checked as
another CPU would run it (`make test-as CPU=avx2`, and `.ci/run` after `make test`).

Three libraries pick their kernels by the CPU, and each has a cap: oneDNN (convolutions, bf16 matmuls:
ONEDNN_MAX_CPU_ISA), ATen's own vectorised kernels (ATEN_CPU_CAPABILITY) and MKL (fp32 matmuls:
MKL_ENABLE_INSTRUCTIONS). A cap only ever imitates a smaller CPU than the one the process runs on.

    python tests/cpu_kernels.py avx2     # the variables for an AVX2-only CPU, as NAME=VALUE words
    python tests/cpu_kernels.py below    # those of the largest kernel set below this machine's own
    python tests/cpu_kernels.py native   # the name of this machine's own set
"""

from __future__ import annotations

import sys
from pathlib import Path

# largest first: each one's (oneDNN, ATen, MKL) caps
KERNEL_SETS = {
    "amx": ("AVX512_CORE_AMX", "avx512", "AVX512_E4"),  # an Intel Xeon with AMX
    "avx512-bf16": ("AVX512_CORE_BF16", "avx512", "AVX512"),  # an AMD Zen 4
    "avx512": ("AVX512_CORE", "avx512", "AVX512"),  # AVX512 without BF16 (Skylake-X)
    "avx2": ("AVX2", "avx2", "AVX2"),  # an AVX2-only CPU (Zen 2/3, Haswell)
    "sse41": ("SSE41", "default", "SSE4_2"),  # the oldest x86-64 kernels all three still have
}
REQUIRES = {"amx": "amx_tile", "avx512-bf16": "avx512_bf16", "avx512": "avx512f", "avx2": "avx2", "sse41": "sse4_1"}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def native(flags: set[str]) -> str:
    """This machine's own set: the largest whose instructions it has."""
    return next((name for name in KERNEL_SETS if REQUIRES[name] in flags), "sse41")


def below(flags: set[str]) -> str:
    """The largest set smaller than this machine's own (its own when it is already the smallest)."""
    names = list(KERNEL_SETS)
    return names[min(names.index(native(flags)) + 1, len(names) - 1)]


def environment(name: str) -> dict[str, str]:
    onednn, aten, mkl = KERNEL_SETS[name]
    return {"ONEDNN_MAX_CPU_ISA": onednn, "ATEN_CPU_CAPABILITY": aten, "MKL_ENABLE_INSTRUCTIONS": mkl}


def main(argv: list[str]) -> int:
    flags = cpu_flags()
    if len(argv) != 1 or argv[0] not in (*KERNEL_SETS, "below", "native"):
        print(f"usage: cpu_kernels.py {{{','.join(KERNEL_SETS)},below,native}}", file=sys.stderr)
        return 2
    if argv[0] == "native":
        print(native(flags))
        return 0
    name = below(flags) if argv[0] == "below" else argv[0]
    if list(KERNEL_SETS).index(name) < list(KERNEL_SETS).index(native(flags)):
        print(f"cpu_kernels.py: {name} is larger than this CPU's own kernels ({native(flags)}); a cap only "
              "imitates a smaller CPU", file=sys.stderr)  # fmt: skip
        return 2
    print(" ".join(f"{key}={value}" for key, value in environment(name).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
