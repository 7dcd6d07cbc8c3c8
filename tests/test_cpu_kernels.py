"""tests/cpu_kernels.py: which kernel set a machine has and which smaller one CI checks beside it."""

from __future__ import annotations

import pytest

from tests.cpu_kernels import below, environment, main, native

ZEN4 = {"sse4_1", "avx2", "avx512f", "avx512_bf16"}
XEON_AMX = ZEN4 | {"amx_tile", "amx_bf16"}
ZEN3 = {"sse4_1", "avx2"}


@pytest.mark.parametrize(
    "flags, own, smaller",
    [(XEON_AMX, "amx", "avx512-bf16"), (ZEN4, "avx512-bf16", "avx512"), (ZEN3, "avx2", "sse41"),
     ({"sse4_1"}, "sse41", "sse41")],
)  # fmt: skip
def test_each_cpu_is_checked_beside_a_smaller_one(flags, own, smaller):
    assert native(flags) == own and below(flags) == smaller


def test_a_kernel_set_caps_all_three_libraries():
    assert environment("avx2") == {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    }


def test_an_unknown_name_is_a_usage_error(capsys):
    assert main(["avx1024"]) == 2 and "usage" in capsys.readouterr().err
