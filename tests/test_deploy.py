"""The container recipes (deploy/) as far as a machine without a registry can check them:
the default CUDA base is a supported vLLM release, and each build's check is the one
`contracts.require_supported` makes, run here on this environment's vLLM."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from histate_vllm.vllm_glue.seam import capabilities as contracts

REPO = Path(__file__).resolve().parents[1]


def build_check(dockerfile: Path) -> str:
    """The Python the Dockerfile's RUN step runs after installing the plugin."""
    text = dockerfile.read_text().replace("\\\n", "")
    (code,) = re.findall(r'python3 -c "([^"]+)"', text)
    return code


def test_supported_range():
    assert [contracts.is_supported(v) for v in
            ("0.31.2", "0.32.0", "0.33.1", "0.34.0", "0.34.5", "0.35.0", "1.0.0", "dev")] == [
        False, True, True, True, True, False, False, False]
    assert contracts.is_supported()  # this environment's vLLM


def test_cuda_base_image_is_a_supported_release():
    text = (REPO / "deploy/cuda/Dockerfile").read_text()
    (tag,) = re.findall(r"ARG BASE=vllm/vllm-openai:v([0-9.]+)", text)
    assert contracts.is_supported(tag) and contracts.minor_version(tag) == contracts.SUPPORTED[1]


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_build_check_passes_on_a_supported_vllm(platform):
    code = build_check(REPO / "deploy" / platform / "Dockerfile")
    assert "require_supported()" in code
    if platform == "rocm":  # the torch here is not a ROCm build: check the rest
        code = code.replace("assert torch.version.hip, 'not a ROCm build of torch'; ", "")
    pre = "import sys\nfor m in ('torchvision', 'torchaudio', 'torchcodec'): sys.modules[m] = None\n"
    out = subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_build_check_stops_an_unsupported_vllm():
    code = ("import vllm\nvllm.__version__ = '0.31.0'\n"
            "from histate_vllm.vllm_glue.seam import capabilities as contracts\n"
            "contracts.VLLM_VERSION = '0.31.0'\ncontracts.require_supported()")
    pre = "import sys\nfor m in ('torchvision', 'torchaudio', 'torchcodec'): sys.modules[m] = None\n"
    out = subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 1 and "supports vLLM 0.32 to 0.34; this is vLLM 0.31.0" in out.stderr
