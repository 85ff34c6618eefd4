"""The fleet tier on a real Mooncake Store: run by test_fleet_mooncake.py inside a private
network namespace (Mooncake's transfer engine and metadata server listen on every
interface whatever they are told; there only loopback exists). Not collected on its own."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from histate_vllm.store.fleet import (
    FleetMiss,
    FleetTier,
    FleetUnavailable,
    MooncakeBackend,
    objects,
)
from histate_vllm.store.fleet.mooncake_service import MooncakeService
from tests.store.test_fleet_tier import assert_restored, checkpoint, identity, page


@pytest.fixture
def service(tmp_path):
    s = MooncakeService(segment="32MB", log_dir=str(tmp_path)).start()
    yield s
    s.stop()


def backend(service, **kw) -> MooncakeBackend:
    return MooncakeBackend(service.master, service.metadata_server, segment_bytes=0,
                           buffer_bytes=16 << 20, **kw)


ENGINE_A = """
import os, sys
sys.path[:0] = {path!r}
from histate_vllm.store.fleet import FleetTier, MooncakeBackend
from tests.store.test_fleet_tier import checkpoint, identity
tier = FleetTier(MooncakeBackend({master!r}, {meta!r}, segment_bytes=0,
                                 buffer_bytes=16 << 20), identity())
key, pos, state, chunks = checkpoint(4)
print(tier.publish_checkpoint(key, pos, state, chunks, provenance="engine-a"), flush=True)
os.kill(os.getpid(), 9)
"""


def test_engine_b_restores_what_a_killed_engine_published(service):
    run = subprocess.run([sys.executable, "-c", ENGINE_A.format(
        path=sys.path, master=service.master, meta=service.metadata_server)],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == -9 and run.stdout.strip() == "True", run.stderr[-2000:]
    tier = FleetTier(backend(service), identity())
    key, pos, state, chunks = checkpoint(4)
    assert tier.has_checkpoints([key]) == [True]
    assert_restored(tier.restore_checkpoint(key), key, pos, state, chunks)


def test_another_identity_reads_nothing(service):
    b = backend(service)
    key, pos, state, chunks = checkpoint(2)
    FleetTier(b, identity()).publish_checkpoint(key, pos, state, chunks)
    other = FleetTier(b, identity(weights="w2"))
    assert other.has_checkpoints([key]) == [False]
    with pytest.raises(FleetMiss, match="missing"):
        other.restore_checkpoint(key)
    # Another identity's manifest put under this one's name is refused by its contents.
    b.upsert(objects.manifest_name(other.identity, key),
             b.get(objects.manifest_name(identity(), key)))
    with pytest.raises(FleetMiss) as e:
        other.restore_checkpoint(key)
    assert e.value.cause == "identity"


@pytest.mark.parametrize("how, cause", [("flip", "corrupt"), ("cut", "truncated")])
def test_a_damaged_object_is_a_miss(service, how, cause):
    b = backend(service)
    tier = FleetTier(b, identity())
    key, pos, state, chunks = checkpoint(2)
    tier.publish_checkpoint(key, pos, state, chunks)
    name = objects.manifest_name(identity(), key)
    m = objects.verify_manifest(name, b.get(name), identity(), key)
    sname = objects.state_name(identity(), m.state_file)
    data = bytearray(b.get(sname))
    data = data[:-1] + bytes([data[-1] ^ 0xFF]) if how == "flip" else data[: len(data) // 2]
    b.upsert(sname, bytes(data))
    with pytest.raises(FleetMiss) as e:
        tier.restore_checkpoint(key)
    assert e.value.cause == cause


def test_a_master_down_at_start_is_unavailable_not_a_hang(service):
    service.stop_master()
    t = time.monotonic()
    with pytest.raises(FleetUnavailable):
        backend(service)
    assert time.monotonic() - t < 30
    # An engine's backend is lazy (spec.open_fleet): it serves from its own tiers and joins
    # the tier once the master is back.
    lazy = backend(service, lazy=True, retry_s=0.5)
    with pytest.raises(FleetUnavailable):
        lazy.exists(["x"])
    service.start_master()
    time.sleep(0.6)
    assert lazy.exists(["x"]) == [False]  # connected (writes need a segment mounted on
    # the new master: a restarted master has lost its segments as well as its objects)


def test_master_down_then_restarted(service):
    tier = FleetTier(backend(service, retry_s=1.0), identity())
    key, pos, state, chunks = checkpoint(2)
    assert tier.publish_checkpoint(key, pos, state, chunks)
    service.stop_master()
    t = time.monotonic()
    with pytest.raises(FleetMiss) as e:
        tier.restore_checkpoint(key)
    assert e.value.cause == "unavailable"
    first = time.monotonic() - t
    t = time.monotonic()
    assert tier.has_checkpoints([key]) == [False]
    assert not tier.publish_checkpoint(key, pos, state, chunks)
    assert time.monotonic() - t < 0.5  # answered at once while the master is known down
    assert first < 15  # Mooncake's own RPC timeout, about 4 s; never a hang
    assert tier.counts["restore", "unavailable"] == 1
    assert tier.counts["publish", "unavailable"] == 1
    # A restarted master (same address) has lost every key: a miss, not an error.
    service.start_master()
    time.sleep(1.2)  # past retry_s
    deadline = time.monotonic() + 30
    cause = None
    while cause != "missing" and time.monotonic() < deadline:
        with pytest.raises(FleetMiss) as e:  # never restored: the new master knows nothing
            tier.restore_checkpoint(key)
        cause = e.value.cause
        time.sleep(1.2)
    assert cause == "missing"


def test_a_full_store_evicts_and_keeps_serving(service):
    tier = FleetTier(backend(service), identity())
    published = []
    # 32 MB of segment; each checkpoint is 5 pages of 12 KiB plus headers: 600 of them
    # are over 40 MB.
    for s in range(600):
        key, pos, state, chunks = checkpoint(4, seed=s % 250)
        key = s.to_bytes(4, "little") + key[4:]
        if tier.publish_checkpoint(key, pos, state, chunks):
            published.append((key, pos, state, chunks))
    assert len(published) > 300
    assert tier.counts["publish", "ok"] + tier.counts["publish", "write_failed"] == 600
    outcomes = []
    for key, pos, state, chunks in (published[0], published[-1]):
        try:
            assert_restored(tier.restore_checkpoint(key), key, pos, state, chunks)
            outcomes.append("ok")
        except FleetMiss as miss:
            outcomes.append(miss.cause)
    assert outcomes[-1] == "ok"  # the newest stays
    assert outcomes[0] in ("ok", "missing")  # the oldest may be evicted: a miss, never wrong


def _race(master, meta, seed, barrier):
    tier = FleetTier(MooncakeBackend(master, meta, segment_bytes=0, buffer_bytes=16 << 20),
                     identity())
    key, pos, _, chunks = checkpoint(3)
    barrier.wait()
    for _ in range(10):
        tier.publish_checkpoint(key, pos, page(1000 + seed),
                                [(k, page(seed * 7 + i)) for i, (k, _) in enumerate(chunks)])


def test_two_engines_writing_one_checkpoint_at_once(service):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_race, args=(service.master, service.metadata_server, s,
                                             barrier)) for s in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    key = checkpoint(3)[0]
    r = FleetTier(backend(service), identity()).restore_checkpoint(key)
    seed = next(s for s in (1, 2) if bytes(r.state) == page(1000 + s).tobytes())
    assert [bytes(v) for _, v in r.chunks] == [page(seed * 7 + i).tobytes() for i in range(3)]


def test_nothing_listens_beyond_loopback_here():
    """The namespace these cases run in has loopback and its own veth pair alone (what keeps
    them private)."""
    out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert {line.split()[1].split("@")[0] for line in out.splitlines()} <= {"lo", "hs0", "hs1"}
    assert os.environ.get("HISTATE_PRIVATE_NET") == "1"
