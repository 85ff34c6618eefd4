"""Every Triton kernel of histate_vllm.kernels compiled for real GPUs, on a CPU, with no device.

`triton.compile` with a `GPUTarget` runs the whole pipeline a launch would: Triton IR, the
target's LLVM IR, then PTX assembled by the ptxas Triton bundles into a cubin for sm_90
(H100/H200), and AMDGCN linked by the bundled ld.lld into an hsaco for gfx942 (MI300X) and
gfx1151 (Strix Halo, an RDNA 3.5 APU: 32-wide waves).
The interpreter runs in test_kernels.py check what the kernels compute; only this checks that
they compile: the interpreter accepts code a GPU build refuses (a kernel that reads a plain
module global, for one, which broke `_checksum` on every real device).

Each kernel is compiled twice per target, as a launch specializes it: with 32-bit scalars
and no alignment, and with 64-bit scalars (a cache past 2**31 words) and every pointer and
scalar 16-aligned (the vectorized path). Word pointers are compiled for each width
`pages.WORD_DTYPE` allows. The compiles run in a child interpreter without TRITON_INTERPRET
(test_kernels.py may have set it in this one) and with a fresh cache, so nothing is reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[1]

TARGETS = {"sm_90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64),
           "gfx1151": ("hip", "gfx1151", 32)}
# The last stage each target's build produces: a device binary, not only assembly text.
BINARY = {"cuda": "cubin", "hip": "hsaco"}

COMPILE = r"""
import json, sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from histate_vllm.kernels import triton_impl as k
from histate_vllm.kernels.pages import WORD_DTYPE

targets = json.loads(sys.argv[1])
ptr = {torch.uint8: "*u8", torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64"}
words = sorted({ptr[d] for d in WORD_DTYPE.values()})
# kernel -> list of pointer-type tuples for its pointer arguments (the rest are scalars)
shapes = {
    "_gather": [(w, "*i64", w) for w in words],
    "_scatter": [(w, "*i64", w) for w in words],
    "_checksum": [("*i32", "*i64", "*i64")],
}
found = sorted(n for n, v in vars(k).items() if isinstance(v, JITFunction))
out = {"kernels": found, "results": []}
for name in found:
    fn = getattr(k, name)
    args = fn.arg_names
    for pointers in shapes.get(name, []):
        for scalar, aligned in (("i32", False), ("i64", True)):
            sig = {}
            for i, a in enumerate(args):
                if a == "BLOCK":
                    sig[a] = "constexpr"
                elif i < len(pointers):
                    sig[a] = pointers[i]
                else:
                    sig[a] = scalar
            attrs = {}
            if aligned:
                attrs = {(i,): [["tt.divisibility", 16]]
                         for i, a in enumerate(args) if a != "BLOCK"}
            for tname, (backend, arch, warp) in targets.items():
                src = ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": k.BLOCK},
                                attrs=attrs)
                row = {"kernel": name, "target": tname, "sig": sig, "aligned": aligned}
                try:
                    c = triton.compile(src, target=GPUTarget(backend, arch, warp))
                    row["stages"] = list(c.asm)
                    row["sizes"] = {s: len(v) for s, v in c.asm.items()}
                except Exception as e:  # reported per kernel, so one failure names itself
                    row["error"] = f"{type(e).__name__}: {e}"[:2000]
                out["results"].append(row)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences a 3.9 warning; no float math
    out = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(TARGETS)], env=env,
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_every_kernel_has_a_signature(compiled):
    """A new @triton.jit kernel must be added to COMPILE's shapes, or it is never compiled."""
    assert compiled["kernels"] == ["_checksum", "_gather", "_scatter"]
    covered = {r["kernel"] for r in compiled["results"]}
    assert covered == set(compiled["kernels"])


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_kernels_compile_to_a_device_binary(compiled, target):
    rows = [r for r in compiled["results"] if r["target"] == target]
    # gather and scatter: 4 word widths x 2 specializations; checksum: 2
    assert len(rows) == 18
    failed = [f"{r['kernel']} {r['sig']} aligned={r['aligned']}: {r['error']}"
              for r in rows if "error" in r]
    assert not failed, "\n\n".join(failed)
    binary = BINARY[TARGETS[target][0]]
    for r in rows:
        assert r["stages"][-1] == binary, r
        assert r["sizes"][binary] > 0, r
