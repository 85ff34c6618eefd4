"""benchmarks/gpu_check.py's dry run on the CPU, with vLLM unimportable: every check runs
on small sizes, so the script a GPU machine runs (torch and Triton only) never rots; and a
broken copy path is caught (FAIL, exit 1), so its PASS lines mean something."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[2]

RUN = """
import runpy, sys
sys.modules["vllm"] = None  # as on the GPU machine: no vLLM
sys.argv = ["gpu_check.py", "--dry-run", "--ssd-dir", sys.argv[1]]
{patch}
runpy.run_path("benchmarks/gpu_check.py", run_name="__main__")
"""

# The staged copy drops the last layer of every key: stores and loads must FAIL.
BREAK = """
from histate_vllm.datapath import copier
real = copier.PageCopier._staged
def staged(self, parts, rows, to_host, breaks):
    saved = self.groups
    self.groups = [g[:-1] for g in saved]
    try:
        real(self, parts, rows, to_host, breaks)
    finally:
        self.groups = saved
copier.PageCopier._staged = staged
"""


def _run(tmp_path, patch=""):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a dry run even on a machine with a GPU
    return subprocess.run([sys.executable, "-c", RUN.format(patch=patch), str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def test_dry_run_passes_every_check_without_vllm(tmp_path):
    out = _run(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    status = {ln.split(":")[0].split("  ", 1)[1]: ln.split()[0] for ln in lines
              if ln.startswith(("PASS  ", "FAIL  ", "SKIP  "))}
    assert status == {"kernels": "PASS", "store/load ordering": "PASS",
                      "two groups aliasing one tensor": "PASS",
                      "vLLM 0.34 DevicePointers, a tensor per layer": "PASS",
                      "vLLM 0.34 DevicePointers, aliased groups": "PASS",
                      "bandwidth DRAM<->GPU": "PASS", "bandwidth SSD->GPU": "PASS"}, lines
    assert "| GPU -> DRAM (copier / pinned memcpy) |" in out.stdout
    assert "| SSD -> GPU (store pipeline / raw O_DIRECT read) |" in out.stdout
    assert lines[-1].startswith("PASS: 0 of 7 checks failed")
    assert not list(tmp_path.iterdir())  # the SSD check cleans up after itself


def test_a_copy_that_drops_bytes_fails_the_check(tmp_path):
    out = _run(tmp_path, BREAK)
    assert out.returncode == 1, out.stdout
    assert "FAIL  store/load ordering: AssertionError: store group 0" in out.stdout
    assert "FAIL  two groups aliasing one tensor" in out.stdout
    assert "FAIL  vLLM 0.34 DevicePointers, a tensor per layer" in out.stdout
    assert "FAIL  vLLM 0.34 DevicePointers, aliased groups" in out.stdout
    assert "PASS  kernels" in out.stdout  # the others still ran and reported
