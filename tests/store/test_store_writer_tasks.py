"""StoreWriter tasks (deletes, resets): run in order with writes, never rejected, silent."""

from __future__ import annotations

import threading

from store_helpers import IDENTITY, make_key, make_payload
from test_store_writer import GatedStore

from histate_vllm.store import StoreWriter

C0, C1 = make_key("c0"), make_key("c1")


def test_task_runs_after_the_writes_before_it_and_reports_nothing(tmp_path):
    gated = GatedStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    w = StoreWriter(gated, max_pending_bytes=100)
    seen = []
    assert w.submit_chunk(C0, make_payload(100, 0), provenance="p")  # in flight, queue full
    assert gated.started.wait(5)
    w.submit_task(lambda s: seen.append(s.has_chunk(C0)), what="probe")  # never rejected
    w.submit_task(lambda s: s.delete_chunk(C0), what="delete")
    w.submit_task(lambda s: seen.append(s.has_chunk(C0)), what="probe")
    gated.gate.set()
    assert w.flush(timeout=10)
    assert seen == [True, False]
    assert [(c.key, c.ok) for c in w.drain_finished()] == [(C0, True)]
    w.close()


def test_failing_task_is_logged_and_the_writer_goes_on(store, caplog):
    w = StoreWriter(store, max_pending_bytes=1 << 20)
    w.submit_task(lambda s: 1 / 0, what="broken")
    assert w.submit_chunk(C1, make_payload(10, 1), provenance="p")
    assert w.flush(timeout=10)
    assert [(c.key, c.ok) for c in w.drain_finished()] == [(C1, True)]
    assert "broken failed" in caplog.text
    w.close()


def test_close_without_drain_drops_tasks_silently(tmp_path):
    gated = GatedStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    w = StoreWriter(gated, max_pending_bytes=1 << 20)
    w.submit_chunk(C0, make_payload(10, 0), provenance="p")
    assert gated.started.wait(5)
    ran = threading.Event()
    w.submit_task(lambda s: ran.set(), what="probe")
    threading.Timer(0.2, gated.gate.set).start()
    w.close(drain=False, timeout=10)
    assert not ran.is_set()
    assert [c.key for c in w.drain_finished()] == [C0]
