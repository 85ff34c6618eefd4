"""Admission.limit: restores sized to the free GPU blocks, against a stand-in KV cache manager
(free blocks and vLLM's per-request remaining-block count); the running total of in-flight
prefills' reservations."""

from types import SimpleNamespace

from histate_vllm.bookkeeping.restore_admission import (
    STATE_BLOCKS,
    Admission,
    evictable_blocks,
    fitting_tokens,
    load_blocks,
)

BT = 384


class FakeKVCacheManager:
    def __init__(self, free: int, remaining: dict[str, int]):
        self.free = free
        self.calls = 0
        self.block_pool = SimpleNamespace(get_num_free_blocks=lambda: self.free)
        self.empty_kv_cache_blocks = SimpleNamespace(blocks=())

        def remaining_blocks(request_id, **_):
            self.calls += 1
            return remaining[request_id]

        self.coordinator = SimpleNamespace(get_num_blocks_to_allocate=remaining_blocks)


def _req(rid: str, tokens: int, computed: int = 0):
    return SimpleNamespace(request_id=rid, num_tokens=tokens, num_prompt_tokens=tokens,
                           num_computed_tokens=computed)


def _admission(free: int, remaining: dict[str, int]) -> Admission:
    a = Admission(BT, n_kv=1, n_state=1, max_model_len=32768)
    a.bind(FakeKVCacheManager(free, remaining))
    return a


def test_block_arithmetic():
    assert load_blocks(0, 10 * BT, BT, 1, 1) == 10 + STATE_BLOCKS
    assert load_blocks(2 * BT, 3 * BT + 1, BT, 2, 1) == 2 * 4 + STATE_BLOCKS
    assert load_blocks(BT, 0, BT, 1, 1) == 0
    assert fitting_tokens(0, 12, BT, 1, 1) == 10 * BT
    assert fitting_tokens(0, STATE_BLOCKS, BT, 1, 1) == 0


def test_a_restore_that_fits_is_not_limited():
    assert _admission(free=40, remaining={}).limit(_req("r", 20 * BT), 0) is None


def test_in_flight_prefills_reservations_shrink_the_restore():
    req = _req("r", 20 * BT)
    a = _admission(free=50, remaining={"p": 20, "l": 4, "a": 10})
    a.track(_req("p", 30 * BT), 5 * BT)  # a prefill in flight
    a.track(_req("l", 10 * BT), 9 * BT)  # a load in flight
    a.track(_req("a", 10 * BT), 0)  # admitted earlier in this scheduling pass
    # 50 free - 34 reserved = 16 blocks: the state's and 14 of KV.
    assert a.reserved() == 34
    assert a.limit(req, 0) == 14 * BT
    # After a 3-block GPU hit the restore starts there; the limit counts tokens past it.
    assert a.limit(req, 3 * BT) == 14 * BT


def test_the_total_follows_allocations_and_releases():
    remaining = {"p": 20, "q": 7}
    a = _admission(free=100, remaining=remaining)
    a.track(_req("p", 30 * BT), 0)
    a.track(_req("q", 30 * BT), 0)
    assert a.reserved() == 27
    remaining["p"] = 12  # p prefilled a chunk: vLLM allocated its blocks
    a.track(_req("p", 30 * BT), 8 * BT)
    assert a.reserved() == 19
    assert a.reserved("q") == 12  # a request's own reservation is not in its way
    a.drop("p")  # done prefilling, preempted or finished
    a.drop("p")  # twice is harmless
    a.drop("never-tracked")
    assert a.reserved() == 7
    remaining["q"] = 0
    a.track(_req("q", 30 * BT), 30 * BT)
    assert a.reserved() == 0 and not a._reserved


def test_a_lookup_does_not_walk_the_requests():
    a = _admission(free=50, remaining={f"p{i}": 1 for i in range(100)})
    for i in range(100):
        a.track(_req(f"p{i}", 10 * BT), BT)
    calls = a._kv_cache_manager.calls
    for _ in range(10):
        a.limit(_req("r", 49 * BT), 0)
    assert a._kv_cache_manager.calls == calls


def test_no_room_at_all_offers_nothing():
    a = _admission(free=30, remaining={"p": 59})
    a.track(_req("p", 60 * BT, computed=BT), BT)
    assert a.limit(_req("r", 20 * BT), 0) == 0


def test_a_sequence_that_cannot_fit_anyway_keeps_its_full_restore():
    # vLLM refuses it with or without the load (its whole sequence must fit the free
    # blocks): shortening the restore would only add prefill once it is admitted.
    a = _admission(free=30, remaining={"p": 59})
    a.track(_req("p", 60 * BT), BT)
    assert a.limit(_req("r", 50 * BT), 0) is None


def test_the_requests_own_evictable_hit_blocks_are_not_free_for_it():
    # 30 free, of which the request's GPU hit takes 4 out of the free queue when admitted.
    a = _admission(free=30, remaining={"p": 10})
    a.track(_req("p", 60 * BT), BT)
    req = _req("r", 20 * BT)
    # 16 blocks of KV past the hit and the state's: 18 fit in 30 - 10 reserved...
    assert a.limit(req, 4 * BT) is None
    # ... not in 26 - 10.
    assert a.limit(req, 4 * BT, own_evictable=4) == (30 - 4 - 10 - STATE_BLOCKS) * BT


def test_vllms_watermark_is_not_free_either():
    a = _admission(free=30, remaining={"p": 10})
    a.track(_req("p", 60 * BT), BT)
    a._kv_cache_manager.watermark_blocks = 4
    assert a.limit(_req("r", 20 * BT), 4 * BT) == (30 - 4 - 10 - STATE_BLOCKS) * BT


def test_evictable_blocks_counts_unreferenced_real_blocks():
    def block(ref_cnt, null=False):
        return SimpleNamespace(ref_cnt=ref_cnt, is_null=null)

    blocks = SimpleNamespace(blocks=([block(0), block(1), block(0, null=True)],
                                     [block(0), block(2)]))
    assert evictable_blocks(blocks) == 2


def test_unbound_admission_never_limits():
    a = Admission(BT, n_kv=1, n_state=1, max_model_len=32768)
    a.track(_req("p", 10 * BT), 0)  # nothing to count with: ignored
    assert a.limit(_req("r", 20 * BT), 0) is None
