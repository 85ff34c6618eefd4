"""A session moves to another engine through the fleet tier (a shared directory): engine A
serves its first turn and dies by SIGKILL; engine B, with its own SSD store, which has
computed the turn's first blocks itself for another prompt, resumes the next turn from the
checkpoint A published, exact against a cold run; B over a copy of
the tier in which that checkpoint's state is another prefix's (re-checksummed, so every
check passes) is caught by the same comparison (the negative control)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from conftest import cold_pair, run_engine
from exactness import assert_caught, matches, measured_tolerance
from tamper import swap_fleet_state

pytestmark = pytest.mark.engine

MiB = 1 << 20
rng = random.Random(58)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


A1 = _tokens(3000)
A2 = A1 + _tokens(40) + _tokens(264)  # the next turn: A1, its answer, a new message
B1 = _tokens(2600)  # another session on engine A: the negative control's donor state
# Served by engine B before A2: B computes A1's first 1792 tokens itself (A checkpoints
# A1 deeper than that) and keeps a state at P's prompt end, inside them (at either block
# size), so A2 resumes from A's checkpoint over KV of which B computed the first blocks
# (as vLLM's prefix cache mixes computations of a prefix).
P = A1[:1792] + _tokens(100)


def _req(name, prompt):
    return dict(name=name, prompt=prompt, max_tokens=4)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fleet-failover")


def _spec(tiny_model, work: Path, ssd: str, fleet: str, requests, **extra) -> dict:
    # One state dtype: the fleet tier moves a store's bytes whatever their layout (both
    # block sizes run through the local store in test_connector_e2e).
    return dict(model=tiny_model, num_gpu_blocks=64, ssm_dtype="bfloat16", dense_states=True,
                connector=dict(dram_bytes=64 * MiB, ssd_dir=str(work / ssd),
                               ssd_bytes=64 * MiB, fleet_backend="dir",
                               fleet_dir=str(work / fleet), fleet_bytes=1 << 30),
                requests=requests, **extra)


@pytest.fixture(scope="module")
def run_a(tiny_model, work):
    run = run_engine(work, "A", _spec(tiny_model, work, "ssd-a", "fleet",
                                      [_req("A1", A1), _req("B1", B1)],
                                      kill_after=dict(fleet_dir=str(work / "fleet"))))
    assert run.returncode == -9 and run.results, run.log[-4000:]
    shutil.copytree(work / "fleet", work / "fleet-tampered")
    return run


@pytest.fixture(scope="module")
def run_b(tiny_model, work, run_a):
    spec = _spec(tiny_model, work, "ssd-b", "fleet", [_req("P", P), _req("A2", A2)])
    spec["connector"]["summary_interval"] = 1.0
    run = run_engine(work, "B", spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def cold(tiny_model, work):
    return cold_pair(work, tiny_model, [_req("A2", A2)])


@pytest.fixture(scope="module")
def tolerance(cold):
    c1, c2 = cold
    return measured_tolerance([(c2, c1, ["A2"])])


def test_the_next_turn_resumes_on_another_engine_from_the_fleet_tier(run_a, run_b):
    bs = run_b.block_size
    cached = run_b["A2"]["num_cached_tokens"]
    # A's deepest checkpoint of A1: its last whole block (a prompt end is checkpointed).
    assert cached == len(A1) // bs * bs, (cached, run_b.log[-3000:])
    assert run_b["P"]["num_cached_tokens"] == 0  # B computed A1's first blocks itself
    assert run_b["A2"]["gpu_cached_tokens"] > 0  # ... and serves them from its GPU
    assert run_b["A2"]["restored"].get("ssd", 0) > 0  # the rest: the pull, via B's SSD
    assert "fetch:pulled=1" in run_b.log


def test_the_resumed_turn_is_exact(run_b, cold, tolerance):
    ok, why = matches(run_b["A2"], cold[0]["A2"], tolerance)
    assert ok, why


def test_negative_control_a_wrong_state_in_the_fleet_tier_is_caught(tiny_model, work, run_a,
                                                                    cold, tolerance):
    swap_fleet_state(work / "fleet-tampered", run_a["A1"]["request_id"],
                     run_a["B1"]["request_id"])
    run = run_engine(work, "Z", _spec(tiny_model, work, "ssd-z", "fleet-tampered",
                                      [_req("A2", A2)]))
    assert run.returncode == 0, run.log[-4000:]
    assert run["A2"]["num_cached_tokens"] > 0  # it did restore the tampered checkpoint
    assert_caught(run["A2"], cold[0]["A2"], tolerance, "a wrong state from the fleet tier")
