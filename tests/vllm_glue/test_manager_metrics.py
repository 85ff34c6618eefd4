"""HiStateManager's metrics, summary line and event log, driven like vLLM's scheduler does."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import ReqContext  # noqa: E402

from histate_vllm.bookkeeping.eventlog import fingerprints, read_log  # noqa: E402
from histate_vllm.config import ConfigError, HiStateConfig  # noqa: E402
from histate_vllm.policy import make_key  # noqa: E402
from histate_vllm.store import SSDStore, StoreIdentity  # noqa: E402
from histate_vllm.vllm_glue import observer as observer_mod  # noqa: E402
from histate_vllm.vllm_glue.layout import CacheLayout  # noqa: E402
from histate_vllm.vllm_glue.manager import HiStateManager  # noqa: E402

BT = 256
KEY = 1000
LAYOUT = CacheLayout(group_ids=(0, 1), state_group_ids=frozenset({1}), key_bytes=KEY,
                     block_tokens=BT)


def identity(model="m"):
    return StoreIdentity(model=model, dtype="bf16", kv_layout="x", block_size=BT, tp_rank=0,
                         tp_size=1, page_bytes=KEY, vllm_version="0")


class Req:
    def __init__(self, rid, hashes, n):
        self.request_id, self.block_hashes, self.num_prompt_tokens = rid, hashes, n
        # Token ids follow the hashes: prompts sharing blocks share tokens.
        self.prompt_token_ids = [hashes[min(i // BT, len(hashes) - 1)][0] * 100000 + i
                                 for i in range(n)]


def hb(n, salt=b"a"):
    return [salt + i.to_bytes(31, "big") for i in range(n)]


def make(tmp_path=None, dram_keys=40, **extra):
    cfg = {"dram_bytes": dram_keys * KEY, "interval": 512, **extra}
    store = None
    if tmp_path is not None:
        cfg.update(ssd_dir=str(tmp_path), ssd_bytes=1 << 30)
        store = SSDStore(str(tmp_path), identity(), budget_bytes=1 << 30)
    m = HiStateManager(LAYOUT, HiStateConfig.from_extra_config(cfg), tokens_per_hash=BT,
                       max_model_len=1 << 16, store=store, step_tokens=BT)
    m.observer.GAUGE_INTERVAL = 0  # gauges on every get_stats, not once a second
    return m


def run(m, rid, hashes, n, hit=0, gpu=0, fail_load=False, land=True, limit=None):
    """One request as vLLM's offloading scheduler drives the manager; returns load slots."""
    r = Req(rid, hashes, n)
    m.register_request(r)
    m.note_hit(r, hit, gpu, limit)
    m.capture_positions(r)
    ctx = ReqContext(req_id=rid)
    slots = None
    if hit > gpu:
        keys = [make_key(h, 0) for h in hashes[gpu // BT : hit // BT]]
        keys.append(make_key(hashes[hit // BT - 1], 1))
        slots = m.prepare_load(keys, ctx).slots
        if fail_load:
            m.note_failed_loads({rid}, set(keys) if fail_load == "corrupt" else ())
        m.complete_load(keys, ctx)
    keys = []
    for i, h in enumerate(hashes[: (n - 1) // BT]):
        for g in (0, 1):
            k = make_key(h, g)
            keys.append(k)
            ctx.set_offload_key_position(k, (i + 1) * BT)
    out = m.prepare_store(keys, ctx)
    m.complete_store(out.keys_to_store, ctx)
    writes = m.take_ssd_writes()
    if land:
        m.on_ssd_written({w.key: True for w in writes})
    m.on_request_finished(ctx)
    return slots


def counters(m):
    stats = m.get_stats()
    return {} if stats is None else stats.data["data"]


def books(m):
    dram = [e for e in m.orch.entries.values() if e.slot >= 0 and e.dram_ready]
    ssd = [e for e in m.orch.entries.values() if e.on_ssd]
    return dram, ssd


def test_restored_tokens_per_tier_and_gauges_match_the_books():
    m = make()
    h = hb(8)
    run(m, "a", h[:4], 4 * BT + 1)
    slots = run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT)
    assert all(s >= 0 for s in slots)
    data = counters(m)
    assert data["histate_restored_tokens"] == {("dram",): 4 * BT}
    assert data["histate_restores"] == {("dram",): 1}
    assert data["histate_lookups"] == {(): 2}
    assert len(data["histate_restore_seconds"][("dram",)]) == 1
    dram, _ = books(m)
    assert data["histate_bytes"] == {("dram",): sum(e.nbytes for e in dram)}
    assert data["histate_entries"][("dram", "state")] == sum(e.is_state for e in dram)
    assert data["histate_entries"][("dram", "kv")] == sum(not e.is_state for e in dram)
    assert "histate_misses" not in data
    # Counters are deltas: a second call without activity reports nothing new.
    assert "histate_restored_tokens" not in counters(m)


def test_a_restore_cut_to_the_free_gpu_blocks_counts_as_gpu_full():
    """The connector cut b's restore to 2 blocks (free GPU blocks) although a's prompt-end
    checkpoint at block 4 was restorable: the miss is `gpu_full`, the 2 blocks prefilled."""
    m = make()
    h = hb(8)
    run(m, "a", h[:4], 4 * BT + 1)
    assert m.policy.restorable(h[:6]).position == 4 * BT
    counters(m)
    run(m, "b", h[:6], 6 * BT + 1, hit=2 * BT, limit=2 * BT)
    data = counters(m)
    assert data["histate_misses"] == {("gpu_full",): 1}
    assert data["histate_missed_tokens"] == {("gpu_full",): 2 * BT}
    run(m, "c", h[:6], 6 * BT + 1, hit=2 * BT)  # control: no cut, the same resume point
    assert "gpu_full" not in {k[0] for k in counters(m).get("histate_misses", {})}


def test_ssd_restores_evictions_and_writes(tmp_path):
    m = make(tmp_path, dram_keys=24)
    h = hb(6)
    run(m, "a", h[:4], 4 * BT + 1)
    for i in range(4):  # a flood of other prompts pushes a's DRAM copies down to SSD
        run(m, f"f{i}", hb(8, b"f%d" % i), 8 * BT + 1)
    data = counters(m)
    slots = run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT)
    assert any(s < 0 for s in slots), "nothing of a was read from SSD"
    loaded = [make_key(x, 0) for x in h[:4]] + [make_key(h[3], 1)]
    ssd_blocks = {m.orch.entries[k].position for k, s in zip(loaded, slots) if s < 0}
    ssd_bytes = sum(m.orch.entries[k].nbytes for k, s in zip(loaded, slots) if s < 0)
    data2 = counters(m)
    restored = data2["histate_restored_tokens"]
    assert restored.get(("ssd",), 0) == len(ssd_blocks) * BT
    # Bytes read per tier: every key the load read, KV and the state.
    read = data2["histate_restored_bytes"]
    assert read[("ssd",)] == ssd_bytes > 0
    assert sum(read.values()) == sum(m.orch.entries[k].nbytes for k in loaded)
    assert sum(restored.values()) == 4 * BT
    assert data2["histate_restores"] == {("ssd",): 1}
    writes = data["histate_ssd_writes"][()] + data2.get("histate_ssd_writes", {}).get((), 0)
    assert writes > 0
    assert sum(data["histate_demotions"].values()) + sum(
        data.get("histate_evictions", {}).values()) > 0
    assert all(tier == "dram" for tier, _ in data["histate_demotions"])
    _, ssd = books(m)
    assert data2["histate_bytes"][("ssd",)] == sum(e.nbytes for e in ssd)
    assert data2["histate_ssd_write_queue"] == {(): 0}


def test_failed_restores_and_dropped_writes(tmp_path):
    m = make(tmp_path)
    h = hb(6)
    run(m, "a", h[:4], 4 * BT + 1, land=False)
    queued = sum(e.ssd_pending for e in m.orch.entries.values())
    assert counters(m)["histate_ssd_write_queue"] == {(): queued} and queued
    pending = [k for k, e in m.orch.entries.items() if e.ssd_pending]
    m.on_ssd_written({pending[0]: False, b"unknown": False})  # queue full on the worker
    run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT, fail_load="corrupt")
    run(m, "c", h[:4] + hb(2, b"q"), 6 * BT + 1, hit=4 * BT, fail_load="io")
    data = counters(m)
    assert data["histate_ssd_writes_dropped"] == {(): 1}
    assert data["histate_misses"] == {("corrupt",): 1, ("load_failed",): 1}
    assert data["histate_missed_tokens"] == {("corrupt",): 4 * BT, ("load_failed",): 4 * BT}
    assert "histate_restored_tokens" not in data


def test_incompatible_when_another_identity_holds_the_checkpoint(tmp_path):
    other = SSDStore(str(tmp_path), identity("other-model"), budget_bytes=1 << 30)
    h = hb(3)
    path = other.layout.manifest_path(make_key(h[1], 1))
    import os

    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    m = make(tmp_path)
    run(m, "a", h, 3 * BT + 1)
    assert counters(m)["histate_misses"] == {("incompatible",): 1}


def test_summary_line_after_activity_and_silent_when_idle(monkeypatch):
    lines = []
    monkeypatch.setattr(observer_mod.logger, "info", lambda msg, *a: lines.append(msg % a))
    m = make(summary_interval=0)  # no thread: log_summary is called by hand
    lines.clear()  # the start-up line
    h = hb(6)
    run(m, "a", h[:4], 4 * BT + 1)
    run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT)
    line = m.observer.log_summary()
    assert lines == [line]
    assert line.startswith(f"HiState: 2 lookups, restored tokens dram={4 * BT}, 0 misses")
    dram, _ = books(m)
    assert line.endswith(f"DRAM MiB {round(sum(e.nbytes for e in dram) / 2**20, 1):g}")
    assert m.observer.log_summary() is None and len(lines) == 1  # idle: nothing more


def test_slot_shortfalls_are_counted_by_what_gave_way(monkeypatch):
    """A step whose DRAM slots are all taken (by copies moving to SSD, held here by hand):
    the policy sheds a's data for b's keys; with a pinned (being loaded) b's keys are
    refused. Both show on /metrics and in the summary line."""
    lines = []
    monkeypatch.setattr(observer_mod.logger, "info", lambda msg, *a: lines.append(msg % a))
    for pinned, outcome in ((False, "shed"), (True, "refused")):
        m = make(dram_keys=8, summary_interval=0)
        lines.clear()
        a = hb(3)
        run(m, "a", a, 3 * BT + 1)
        if pinned:
            m.policy.pin(list(m.orch.entries))
        while m.orch.pool.alloc(KEY) is not None:  # moves in flight hold the rest
            pass
        counters(m)
        run(m, "b", hb(2, b"b"), 2 * BT + 1)
        short = counters(m)["histate_slot_shortfalls"]
        assert set(short) == {(outcome,)} and short[(outcome,)] > 0
        assert m.orch.stats[{"shed": "slot_shed", "refused": "slot_short"}[outcome]] > 0
        line = m.observer.log_summary()
        assert f"short of a DRAM slot ({outcome}=" in line


def test_summary_thread_logs_once_per_burst(monkeypatch):
    import time

    lines = []
    monkeypatch.setattr(observer_mod.logger, "info", lambda msg, *a: lines.append(msg % a))
    m = make(summary_interval=0.05)
    run(m, "a", hb(3), 3 * BT + 1)
    time.sleep(0.5)
    m.shutdown()
    assert [ln for ln in lines if "lookups" in ln] == [lines[-1]]
    assert lines[-1].startswith("HiState: 1 lookups")


def test_event_log_records_lookups_inside_the_store(tmp_path):
    m = make(tmp_path)
    h = hb(6)
    run(m, "a", h[:4], 4 * BT + 1)
    run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT)
    m.shutdown()
    events, lookups = read_log(str(tmp_path / m.store.layout.digest / "events"))
    assert [lk.request_id for lk in lookups] == ["a", "b"]
    b = lookups[1]
    assert (b.covered, b.prompt_tokens, b.nodes) == (4 * BT, 6 * BT + 1, h[:6])
    assert b.fps == fingerprints(Req("b", h[:6], 6 * BT + 1).prompt_token_ids, BT)
    assert {e.op for e in events} >= {"admit", "plan", "hit"}


def test_metric_definitions_and_prometheus_registration():
    import prometheus_client
    from prometheus_client import Counter, Gauge, Histogram

    from histate_vllm.connector import HiStateConnector
    from histate_vllm.vllm_glue.offloading_spec import HiStateSpec
    from histate_vllm.vllm_glue.prom_metrics import definitions

    defs = HiStateSpec.build_metric_definitions({})
    assert defs.keys() == definitions().keys() and all(n.startswith("histate") for n in defs)
    cfg = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))
    registry = prometheus_client.CollectorRegistry()

    def bind(cls):
        return lambda *a, **kw: cls(*a, registry=registry, **kw)

    prom = HiStateConnector.build_prom_metrics(
        cfg, {Counter: bind(Counter), Gauge: bind(Gauge), Histogram: bind(Histogram)},
        ["model_name"], {0: ["tiny"]})
    m = make()
    h = hb(6)
    run(m, "a", h[:4], 4 * BT + 1)
    run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT)
    prom.observe(m.get_stats().data, 0)
    text = prometheus_client.generate_latest(registry).decode()
    assert f'histate_restored_tokens_total{{model_name="tiny",tier="dram"}} {float(4 * BT)}' \
        in text
    assert "cpu" not in text.lower()  # vLLM's CPU-spec gauges are not registered
    assert "kv_offload_total_bytes" not in text  # nor the legacy per-direction counters
    assert "kv_offload_load_bytes" in text  # vLLM's transfer metrics stay


def test_config_validates_the_new_keys():
    assert HiStateConfig.from_extra_config({"dram_bytes": 1}).summary_interval == 60.0
    assert HiStateConfig.from_extra_config(
        {"dram_bytes": 1, "summary_interval": "0"}).summary_interval == 0.0
    for bad in (-1, "soon", True, float("nan")):
        with pytest.raises(ConfigError, match="summary_interval"):
            HiStateConfig.from_extra_config({"dram_bytes": 1, "summary_interval": bad})
    with pytest.raises(ConfigError, match="event_log_bytes"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "event_log_bytes": 0})


def test_inspect_table_and_why(tmp_path, capsys):
    import json

    from histate_vllm.__main__ import main

    log = tmp_path / "log"
    m = make(dram_keys=24, event_log_dir=str(log))
    h = hb(6)
    run(m, "a", h[:4], 4 * BT + 1)
    run(m, "b", h[:6], 6 * BT + 1, hit=4 * BT)
    for i in range(4):  # DRAM only: the flood evicts a's and b's entries
        run(m, f"f{i}", hb(8, b"f%d" % i), 8 * BT + 1)
    run(m, "c", h[:6] + hb(1, b"c"), 7 * BT + 1)
    m.shutdown()
    assert main(["inspect", str(log)]) == 0
    out = capsys.readouterr().out
    states = [e for e in m.orch.entries.values() if e.is_state]
    assert f"{len(states)} checkpoints" in out and "dram" in out
    assert "lookups" in out and "evicted=1" in out
    prompt = tmp_path / "prompt.json"
    prompt.write_text(json.dumps(Req("x", h[:6] + hb(1, b"c"), 7 * BT + 1).prompt_token_ids))
    assert main(["inspect", str(log), "why", str(prompt)]) == 0
    out = capsys.readouterr().out
    assert "closest logged request: c" in out
    assert "MISS (evicted)" in out and "evict" in out
    prompt.write_text(json.dumps(Req("y", h[:6], 6 * BT + 1).prompt_token_ids))
    main(["inspect", str(log), "why", str(prompt)])
    out = capsys.readouterr().out
    assert "closest logged request: c" in out  # the latest of equally matching requests


def test_idle_engine_steps_until_ssd_work_settles_and_then_shows_it(tmp_path):
    """has_pending_work keeps vLLM stepping an idle engine while a request's last copies
    are staged or being written; the step that settles them publishes the write queue at
    once (the gauges otherwise wait GAUGE_INTERVAL, and an idle engine steps no more)."""
    m = make(tmp_path)
    m.observer.GAUGE_INTERVAL = 3600
    assert not m.has_pending_work()
    counters(m)  # the first gauges
    r = Req("a", hb(4), 4 * BT + 1)
    m.register_request(r)
    m.note_hit(r, 0, 0)
    ctx = ReqContext(req_id="a")
    keys = []
    for i, h in enumerate(hb(4)):
        for g in (0, 1):
            keys.append(make_key(h, g))
            ctx.set_offload_key_position(keys[-1], (i + 1) * BT)
    m.complete_store(m.prepare_store(keys, ctx).keys_to_store, ctx)
    m.on_request_finished(ctx)
    assert m.has_pending_work()  # staged: the next (empty) step issues them
    writes = m.take_ssd_writes()
    assert writes and m.has_pending_work()  # in flight: their outcome is still to come
    assert "histate_ssd_write_queue" not in counters(m)  # not yet GAUGE_INTERVAL
    m.on_ssd_written({w.key: True for w in writes})
    assert not m.has_pending_work()
    assert counters(m)["histate_ssd_write_queue"] == {(): 0}  # published on settling
    assert "histate_ssd_write_queue" not in counters(m)
