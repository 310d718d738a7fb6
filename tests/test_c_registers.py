"""The GEMM micro-kernels keep their accumulators in registers on AVX-512 (32 vector
registers) and on AVX2 (16), whichever CPU runs the tests: the generated C of real models is
compiled to assembly for both, and no multiply-add of a GEMM kernel may read the stack.

A k-loop whose accumulator lives on the stack runs a load-FMA-store chain per step: the
next-tile prefetch's branch once did that to AVX2's 3 x 4 tile (densenet121 1.43x as long
at 1 thread on a Zen 3), unseen on the AVX-512 machine where it was measured."""

from __future__ import annotations

import platform
import re
import subprocess

import onnx_ir as ir
import pytest
from c_backend_util import needs_compiler

from codegraft.backends.c._codegen import generate
from codegraft.backends.c._toolchain import Toolchain, _base_flags, target_for
from codegraft.testing import light_model

pytestmark = [
    needs_compiler,
    pytest.mark.skipif(platform.machine().lower() not in {"x86_64", "amd64"}, reason="x86 targets only"),
]

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"})
AVX2 = frozenset({"avx2", "fma"})
FUNCTION = re.compile(r"^([A-Za-z_][\w.]*):")
FMA_FROM_STACK = re.compile(r"\bvfn?m(add|sub)\w*\s+-?\d*\(%r[sb]p")


def stack_fmas(source: str, flags: tuple[str, ...]) -> dict[str, int]:
    """Per function of ``source`` compiled with ``flags``: its FMAs with an operand on the stack."""
    compiler = Toolchain().resolved_compiler()
    base = [f for f in _base_flags(compiler) if f != "-shared"]
    done = subprocess.run([compiler, *base, *flags, "-S", "-o", "-", "-x", "c", "-"],
                          input=source, capture_output=True, text=True, check=True)
    found: dict[str, int] = {}
    function = ""
    for line in done.stdout.splitlines():
        if match := FUNCTION.match(line):
            function = match.group(1)
        elif FMA_FROM_STACK.search(line):
            found[function] = found.get(function, 0) + 1
    return found


def test_the_check_sees_an_accumulator_on_the_stack() -> None:
    source = """
    typedef float vf __attribute__((vector_size(32)));
    vf cg_mk_spill(const vf* w, const float* x, long n) {
      vf a[17] = {{0}};
      for (long i = 0; i < n; i++) {
        __asm__ volatile("" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                         "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14");
        for (int j = 0; j < 17; j++) a[j] += x[i + j] * w[j];
      }
      vf s = a[0];
      for (int j = 1; j < 17; j++) s += a[j];
      return s;
    }
    """
    assert stack_fmas(source, ("-mavx2", "-mfma")).get("cg_mk_spill")


@pytest.mark.parametrize("model", ["resnet50", "shufflenet"])
@pytest.mark.parametrize("features", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_gemm_accumulators_stay_in_registers(model: str, features: frozenset[str]) -> None:
    target = target_for(features)
    source = generate(ir.from_proto(light_model(model)), target, 1).source
    assert "cg_mk_" in source
    spilled = {name: n for name, n in stack_fmas(source, target.flags).items() if name.startswith(("cg_mk", "cg_gemm"))}
    assert not spilled, f"GEMM kernels with FMAs on the stack ({target.vector_floats} floats a vector): {spilled}"
