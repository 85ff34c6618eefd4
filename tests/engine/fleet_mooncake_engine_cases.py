"""Real engines on a fleet tier in Mooncake Store: run by test_fleet_mooncake_engines.py in a
private network namespace (Mooncake listens on every interface whatever it is told; there
only loopback and a veth pair exist). Not collected on its own.

Engine A serves a turn and dies by SIGKILL; engine B resumes the next turn from the tier,
exact against a cold run. Then the master restarts (empty) and dies while engine D runs:
D serves every request from its own tiers, none waiting longer than the tier's deadline,
the misses counted by cause."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from conftest import cold_pair, run_engine
from exactness import matches, measured_tolerance
from histate_vllm.store.fleet.mooncake_service import MooncakeService

MiB = 1 << 20
rng = random.Random(5858)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


A1 = _tokens(3000)
A2 = A1 + _tokens(40) + _tokens(264)
D1 = _tokens(2000)
D2 = D1 + _tokens(300)


def _req(name, prompt, **kw):
    return dict(name=name, prompt=prompt, max_tokens=4, **kw)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fleet-mooncake")


@pytest.fixture(scope="module")
def service(work):
    s = MooncakeService(segment="256MB", log_dir=str(work)).start()
    yield s
    s.stop()


def _spec(tiny_model, work: Path, ssd: str, service, requests, **extra) -> dict:
    return dict(model=tiny_model, num_gpu_blocks=64, ssm_dtype="bfloat16", dense_states=True,
                connector=dict(dram_bytes=64 * MiB, ssd_dir=str(work / ssd),
                               ssd_bytes=64 * MiB, **service.settings(),
                               fleet_local_hostname="127.0.0.1",
                               fleet_lookup_timeout_s=0.5),
                requests=requests, **extra)


@pytest.fixture(scope="module")
def run_b(tiny_model, work, service):
    a = run_engine(work, "A", _spec(tiny_model, work, "ssd-a", service, [_req("A1", A1)],
                                    kill_after=dict(wait_s=5.0)))
    assert a.returncode == -9 and a.results, a.log[-4000:]
    b = run_engine(work, "B", _spec(tiny_model, work, "ssd-b", service, [_req("A2", A2)]))
    assert b.returncode == 0, b.log[-4000:]
    return b


@pytest.fixture(scope="module")
def cold(tiny_model, work):
    return cold_pair(work, tiny_model, [_req("A2", A2)])


def test_engine_b_resumes_a_killed_engines_session_exactly(run_b, cold):
    bs = run_b.block_size
    assert run_b["A2"]["num_cached_tokens"] == len(A1) // bs * bs, run_b.log[-3000:]
    tol = measured_tolerance([(cold[1], cold[0], ["A2"])])
    ok, why = matches(run_b["A2"], cold[0]["A2"], tol)
    assert ok, why


def test_a_dead_master_costs_no_request_more_than_the_deadline(tiny_model, work, service,
                                                              run_b):
    # (A master down when an engine starts: the backend's setup fails and the engine says
    # so once and serves from its own tiers: tests/store/fleet_mooncake_cases.py.)
    service.stop_master()
    # D: the master came back empty (every key lost), then dies under D's feet.
    service.start_master()
    master = service.master_proc.pid
    spec = _spec(tiny_model, work, "ssd-d", service,
                 [_req("A2", A2), _req("D1", D1, kill_pid=master), _req("D2", D2)])
    spec["connector"]["summary_interval"] = 1.0
    d = run_engine(work, "D", spec)
    assert d.returncode == 0, d.log[-4000:]
    assert d["A2"]["num_cached_tokens"] == 0  # the restarted master knew nothing
    bs = d.block_size
    assert d["D2"]["num_cached_tokens"] >= len(D1) // bs * bs - bs  # its own tiers serve on
    for name in ("D1", "D2"):  # the lookup deadline, not Mooncake's 4 s RPC timeout
        assert d[name]["queued_s"] < 0.5 + 1.5, (name, d[name]["queued_s"])
    counted = " ".join(re.findall(r"fleet tier \S+", d.log))
    assert "fetch:deadline" in counted or "fetch:unavailable" in counted, counted
