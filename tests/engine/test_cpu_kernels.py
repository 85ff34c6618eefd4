"""examples/vllm_cpu_kernels' host implementations of vLLM's align-mode state copies leave
the same bytes as vLLM's own Triton kernels, run by Triton's interpreter
(cpu_kernels_check.py: 120 random launches, both conv layouts, both postprocess forms)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.engine


def test_host_kernels_match_vllms_triton_kernels():
    here = REPO / "tests" / "engine"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(here / "triton_interp"), str(REPO / "examples" / "vllm_cpu_kernels"), str(REPO)]))
    r = subprocess.run([sys.executable, str(here / "cpu_kernels_check.py")], env=env,
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "OK: 120 launches identical" in out, out[-3000:]
