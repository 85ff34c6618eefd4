"""The fleet tier on a shared directory: a checkpoint restores whole and checked, or is a miss
with its cause; never a partial restore, another identity's bytes, or a hang.
(The same tier on Mooncake Store: test_fleet_mooncake.py.)"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from histate_vllm.store.fleet import (
    DirBackend,
    FleetMiss,
    FleetTier,
    FleetUnavailable,
    FleetWriteFailed,
    objects,
)
from histate_vllm.store.format import StoreIdentity

PAGE = 4096 * 3


def identity(**kw) -> StoreIdentity:
    base = dict(model="tiny", dtype="bfloat16", kv_layout="NHD", block_size=256, tp_rank=0,
                tp_size=1, page_bytes=PAGE, vllm_version="0.32.0", weights="w1")
    base.update(kw)
    return StoreIdentity(**base)


def page(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8)


def checkpoint(n: int, seed: int = 0):
    """(key, position, state, chunks) of a checkpoint after n KV chunks."""
    chunks = [(bytes([seed, i]) * 8, page(seed * 100 + i)) for i in range(n)]
    return bytes([seed, 255]) * 8, n * 256, page(seed * 100 + 99), chunks


def assert_restored(r, key, position, state, chunks):
    assert r.key == key and r.position == position
    assert bytes(r.state) == state.tobytes()
    assert [(k, bytes(v)) for k, v in r.chunks] == [(k, p.tobytes()) for k, p in chunks]


@pytest.fixture
def tier(tmp_path):
    return FleetTier(DirBackend(tmp_path / "fleet", budget_bytes=1 << 30), identity())


def test_a_checkpoint_restores_whole_on_another_engine(tmp_path, tier):
    key, pos, state, chunks = checkpoint(4)
    assert tier.publish_checkpoint(key, pos, state, chunks, provenance="req-1")
    other = FleetTier(DirBackend(tmp_path / "fleet", budget_bytes=1 << 30), identity())
    assert other.has_checkpoints([key, b"x" * 16]) == [True, False]
    assert_restored(other.restore_checkpoint(key), key, pos, state, chunks)
    assert other.counts["restore", "ok"] == 1


def test_chunks_shared_by_checkpoints_are_stored_once(tmp_path, tier):
    key, pos, state, chunks = checkpoint(4)
    tier.publish_checkpoint(key, pos, state, chunks)
    files = lambda: {p for p in (tmp_path / "fleet").rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    tier.publish_checkpoint(b"k2" * 8, 2 * 256, page(7), chunks[:2])
    new = files() - before
    assert sorted(p.parent.name for p in new) == ["mf", "st"]  # the chunks were there


def _tamper(tmp_path, kind: str, how: str) -> None:
    (path,) = [p for p in (tmp_path / "fleet").rglob("*") if f"/{kind}/" in str(p)][:1]
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-1] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind, how, cause", [
    ("kv", "flip", "corrupt"), ("kv", "cut", "truncated"), ("st", "flip", "corrupt"),
    ("st", "cut", "truncated"), ("mf", "flip", "corrupt"), ("mf", "cut", "truncated"),
])
def test_a_damaged_object_is_a_miss_with_its_cause(tmp_path, tier, kind, how, cause):
    key, pos, state, chunks = checkpoint(1)
    tier.publish_checkpoint(key, pos, state, chunks)
    _tamper(tmp_path, kind, how)
    with pytest.raises(FleetMiss) as e:
        tier.restore_checkpoint(key)
    assert e.value.cause == cause
    assert tier.counts["restore", cause] == 1


def test_a_missing_chunk_is_a_miss(tmp_path, tier):
    key, pos, state, chunks = checkpoint(3)
    tier.publish_checkpoint(key, pos, state, chunks)
    next((tmp_path / "fleet").rglob("kv/*")).unlink()
    with pytest.raises(FleetMiss, match="missing"):
        tier.restore_checkpoint(key)


def test_another_model_or_tenant_never_reads_it(tmp_path, tier):
    key, pos, state, chunks = checkpoint(2)
    tier.publish_checkpoint(key, pos, state, chunks)
    backend = DirBackend(tmp_path / "fleet", budget_bytes=1 << 30)
    for other in (identity(weights="w2"), identity(model="other"), identity(tp_rank=1)):
        t = FleetTier(backend, other)
        assert t.has_checkpoints([key]) == [False]  # its own namespace: nothing there
        with pytest.raises(FleetMiss, match="missing"):
            t.restore_checkpoint(key)
    # An object copied into another identity's namespace is refused by its contents.
    spy = FleetTier(backend, identity(weights="w2"))
    src = tmp_path / "fleet" / objects.manifest_name(identity(), key)
    dst = tmp_path / "fleet" / objects.manifest_name(spy.identity, key)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    with pytest.raises(FleetMiss) as e:
        spy.restore_checkpoint(key)
    assert e.value.cause == "identity"


def _publish(root: str, seed: int, barrier) -> None:
    tier = FleetTier(DirBackend(root, budget_bytes=1 << 30), identity())
    key, pos, _, chunks = checkpoint(3)
    barrier.wait()
    for _ in range(20):
        # Same checkpoint, the bytes each engine computed (they may differ in rounding).
        tier.publish_checkpoint(key, pos, page(1000 + seed), [(k, page(seed * 7 + i))
                                                             for i, (k, _) in enumerate(chunks)])


def test_two_engines_writing_one_checkpoint_at_once(tmp_path):
    root = str(tmp_path / "fleet")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_publish, args=(root, s, barrier)) for s in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    key, pos, _, chunks = checkpoint(3)
    r = FleetTier(DirBackend(root, budget_bytes=1 << 30), identity()).restore_checkpoint(key)
    # One engine's checkpoint, whole: its state and its own chunks, never a mix.
    seed = {1000 + s: s for s in (1, 2)}[
        next(s for s in (1001, 1002) if bytes(r.state) == page(s).tobytes())]
    assert [bytes(v) for _, v in r.chunks] == [page(seed * 7 + i).tobytes() for i in range(3)]
    assert not list((tmp_path / "fleet").rglob(".*.tmp"))


def test_a_full_directory_evicts_the_least_recently_used(tmp_path):
    obj = objects.HEADER_BYTES + PAGE
    backend = DirBackend(tmp_path / "fleet", budget_bytes=12 * obj)
    tier = FleetTier(backend, identity())
    old = checkpoint(2, seed=1)
    tier.publish_checkpoint(*old[:3], old[3])
    for s in range(2, 8):
        cp = checkpoint(2, seed=s)
        tier.publish_checkpoint(*cp[:3], cp[3])
    assert backend._scan_usage() <= 12 * obj
    with pytest.raises(FleetMiss, match="missing"):
        tier.restore_checkpoint(old[0])  # the oldest went; a miss, not an error
    newest = checkpoint(2, seed=7)
    assert_restored(tier.restore_checkpoint(newest[0]), *newest)


_MOUNTED = """
import sys
sys.path[:0] = {path!r}
from tests.store.test_fleet_tier import checkpoint, identity
from histate_vllm.store.fleet import DirBackend, FleetTier
tier = FleetTier(DirBackend({root!r}, budget_bytes=1 << 30), identity())
ok = tier.publish_checkpoint(*checkpoint(2)[:3], checkpoint(2)[3])
print(ok, tier.counts["publish", "write_failed"])
"""


@pytest.mark.parametrize("mount", [
    "mount --bind {root} {root} && mount -o remount,ro,bind {root}",  # read-only
    "mount -t tmpfs -o size=16k tmpfs {root}",  # too small for one checkpoint: full
])
def test_a_read_only_or_full_directory_fails_the_publish_not_the_engine(tmp_path, mount):
    """A real mount in a private mount namespace (root, as here and in CI)."""
    import subprocess
    import sys

    root = tmp_path / "fleet"
    root.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(_MOUNTED.format(path=sys.path, root=str(root)))
    cmd = f"{mount.format(root=root)} && {sys.executable} {probe}"
    run = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True)
    if run.returncode != 0 and "Operation not permitted" in run.stderr:
        pytest.skip("no mount namespace here: " + run.stderr.strip()[-200:])
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "1"]


def test_a_write_that_fails_leaves_the_tier_as_it_was(tmp_path, monkeypatch):
    backend = DirBackend(tmp_path / "fleet", budget_bytes=1 << 30)
    tier = FleetTier(backend, identity())
    key, pos, state, chunks = checkpoint(2)
    tier.publish_checkpoint(key, pos, state, chunks)
    real = backend.upsert

    def full(name, data):
        raise FleetWriteFailed(28, "No space left on device")

    monkeypatch.setattr(backend, "upsert", full)
    assert not tier.publish_checkpoint(key, pos, page(5), chunks)  # its manifest fails
    monkeypatch.setattr(backend, "upsert", real)
    assert tier.counts["publish", "write_failed"] == 1
    assert_restored(tier.restore_checkpoint(key), key, pos, state, chunks)  # the old one


def test_an_unreachable_directory_is_a_miss_not_a_hang(tmp_path, tier):
    key, pos, state, chunks = checkpoint(1)
    tier.publish_checkpoint(key, pos, state, chunks)

    def gone(name):
        raise FleetUnavailable(116, "Stale file handle")

    tier.backend.get = gone
    tier.backend.exists = lambda names: (_ for _ in ()).throw(FleetUnavailable(116, "stale"))
    with pytest.raises(FleetMiss) as e:
        tier.restore_checkpoint(key)
    assert e.value.cause == "unavailable"
    assert tier.has_checkpoints([key]) == [False]
    assert tier.counts["lookup", "unavailable"] == 1


def test_object_names_stay_inside_the_directory(tmp_path):
    backend = DirBackend(tmp_path / "fleet", budget_bytes=1 << 20)
    for bad in ("../x", "/etc/passwd", "a/../../b"):
        with pytest.raises(ValueError):
            backend.put(bad, b"x")
