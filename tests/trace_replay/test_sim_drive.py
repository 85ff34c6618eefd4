"""The SSD shared by restores and writes, with the engine's bounded write queue."""

import pytest
from _sim_helpers import KVB, MB, SessionBuilder, run, workload

from histate_vllm.config import HiStateConfig
from trace_replay.cli import DEFAULT_SSD_QUEUE_BYTES
from trace_replay.sim.compute import SharedPrefill
from trace_replay.sim.drive import Drive
from trace_replay.sim.engine import _STEP  # noqa: F401  (the step event exists)


def serve(drive: Drive, until: float) -> list:
    out = []
    while True:
        t = drive.next_completion()
        if t is None or t > until:
            break
        out += [(arg, t) for _, arg in drive.advance(t)]
    return out


def test_reads_and_writes_halve_the_drive_while_both_have_work():
    d = Drive(1.0, 1.0, queue_bytes=None)
    d.read(0.0, 2.0, None, "r")
    assert d.write(0.0, 1.0, None, "w")
    done = dict(serve(d, 10.0))
    # both at half speed until the write is done at 2; the read's last byte alone: 3
    assert done == pytest.approx({"w": 2.0, "r": 3.0})
    assert d.stats["read_bytes"] == 2.0 and d.stats["written_bytes"] == 1.0


def test_alone_a_read_has_the_whole_drive_and_reads_are_fifo():
    d = Drive(2.0, 1.0, queue_bytes=None)
    d.read(0.0, 2.0, None, "a")
    d.read(0.5, 2.0, None, "b")
    assert dict(serve(d, 10.0)) == pytest.approx({"a": 1.0, "b": 2.0})


def test_a_full_queue_drops_the_newest_write_and_keeps_what_is_queued():
    d = Drive(1.0, 1.0, queue_bytes=3)
    assert d.write(0.0, 2, None, "a")
    assert d.write(0.0, 1, None, "b")
    assert not d.write(0.0, 1, None, "c")  # 3 pending: no room
    assert d.stats["writes_dropped"] == 1 and d.stats["write_bytes_dropped"] == 1
    d.advance(2.0)  # a written: 1 pending
    assert d.write(2.0, 2, None, "d")
    # one larger than the whole bound only into an empty queue, as StoreWriter
    assert not d.write(2.0, 10, None, "e")
    serve(d, 100.0)
    assert d.write(100.0, 10, None, "f")


def test_free_writes_take_no_drive_time_and_are_never_dropped():
    d = Drive(1.0, 1.0, queue_bytes=1, charge_writes=False)
    d.read(0.0, 1.0, None, "r")
    for i in range(5):
        assert d.write(0.0, 100, None, i)
    assert [a for _, a in d.advance(0.0)] == [0, 1, 2, 3, 4]
    assert d.next_completion() == pytest.approx(1.0)


def test_the_simulator_default_queue_is_the_connectors():
    assert DEFAULT_SSD_QUEUE_BYTES == HiStateConfig.ssd_queue_bytes


def test_shared_prefill_reports_step_marks_when_passed():
    q = SharedPrefill(2)
    q.add(0.0, 4.0, "a", marks=[3.0, 1.0])  # steps end after 1 s and 3 s of its work
    q.add(0.0, 4.0, "b")
    assert q.next_completion() == pytest.approx(2.0)  # a's first mark at half speed
    q.wake(2.0)
    assert q.take_marks() == [("a", 0)]
    assert q.next_completion() == pytest.approx(6.0)
    assert q.wake(6.0) == []
    assert q.take_marks() == [("a", 1)]
    assert sorted(q.wake(8.0)) == ["a", "b"]


def _long_session():
    return SessionBuilder("a").turn(64 * 40).turn(64 * 4)


@pytest.mark.parametrize("policy", ["histate", "vllm-disk"])
def test_writes_are_charged_and_dropped_in_a_run(policy):
    wl = workload(_long_session())
    _, res = run(wl, policy, gpu=64 * MB, dram=400 * MB, ssd=4000 * MB, chunk=64 * 4)
    st = res.stats
    assert st["ssd_written_gb"] > 0
    assert st["ssd_write_busy_s"] > 0
    # the queue (256 MiB) holds the writes of a 4-block step: nothing dropped here
    assert st["ssd_writes_dropped"] == 0
    assert st["ssd_written_gb"] * 1e9 >= 40 * KVB * 0.99


@pytest.mark.parametrize("policy", ["histate", "vllm-disk"])
def test_a_small_queue_drops_the_baselines_writes_histate_paces_its_own(policy):
    from trace_replay.sim import ReplaySettings
    from trace_replay.simulate import SimConfig, prepare, run_policy

    wl = workload(_long_session())
    cfg = SimConfig(gpu_bytes=8 * MB, dram_bytes=400 * MB, ssd_bytes=4000 * MB,
                    block_tokens=64, chunk_tokens=64 * 40, ssd_queue_bytes=3 * KVB,
                    replay=ReplaySettings())
    prep = prepare(wl, cfg)
    res = run_policy(prep, policy)
    st = res.stats
    if policy == "histate":
        # the orchestrator never hands out more than the queue takes: it defers backups
        assert st["ssd_writes_dropped"] == 0
        assert st["backups_deferred"] > 0
    else:
        assert st["ssd_writes_dropped"] > 0
    assert res.hit[1] > 0  # the second turn resumes from what DRAM kept
