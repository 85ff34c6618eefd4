"""Admission.cap: restores sized to the free GPU blocks, against a stand-in KV cache manager
(free blocks and vLLM's per-request remaining-block count)."""

from types import SimpleNamespace

from vllm.v1.request import RequestStatus

from histate_vllm.admission import STATE_BLOCKS, Admission, fitting_tokens, load_blocks

BT = 384


class FakeKVCacheManager:
    def __init__(self, free: int, remaining: dict[str, int]):
        self.block_pool = SimpleNamespace(get_num_free_blocks=lambda: free)
        self.empty_kv_cache_blocks = SimpleNamespace(blocks=())
        self.coordinator = SimpleNamespace(
            get_num_blocks_to_allocate=lambda request_id, **_: remaining[request_id])


def _req(rid: str, tokens: int, status=RequestStatus.WAITING, computed: int = 0,
         prefilling: bool = False):
    return SimpleNamespace(request_id=rid, num_tokens=tokens, num_prompt_tokens=tokens,
                           num_computed_tokens=computed, status=status,
                           is_prefill_chunk=prefilling)


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


def test_a_restore_that_fits_is_not_capped():
    req = _req("r", 20 * BT)
    assert _admission(free=40, remaining={}).cap(req, 0, 19 * BT, [req]) is None


def test_in_flight_prefills_reservations_shrink_the_restore():
    req = _req("r", 20 * BT)
    running = _req("p", 30 * BT, RequestStatus.RUNNING, computed=5 * BT, prefilling=True)
    loading = _req("l", 10 * BT, RequestStatus.WAITING_FOR_REMOTE_KVS, computed=9 * BT)
    decoding = _req("d", 30 * BT, RequestStatus.RUNNING, computed=30 * BT)
    queued = _req("q", 30 * BT)
    # Admitted earlier in this scheduling pass: is_prefill_chunk is not updated yet.
    admitted = _req("a", 10 * BT, RequestStatus.RUNNING, computed=0)
    live = [req, running, loading, decoding, queued, admitted]
    a = _admission(free=50, remaining={"p": 20, "l": 4, "d": 99, "q": 99, "a": 10})
    # 50 free - 34 reserved (the prefills and the load, not the decode or the queued one)
    # = 16 blocks: the state's and 14 of KV.
    assert a.cap(req, 0, 19 * BT, live) == 14 * BT
    # After a 3-block GPU hit the restore starts there; the cap counts tokens past it.
    assert a.cap(req, 3 * BT, 16 * BT, live) == 14 * BT


def test_no_room_at_all_offers_nothing():
    req = _req("r", 20 * BT)
    running = _req("p", 60 * BT, RequestStatus.RUNNING, computed=BT, prefilling=True)
    assert _admission(free=30, remaining={"p": 59}).cap(req, 0, 19 * BT, [req, running]) == 0


def test_a_sequence_that_cannot_fit_anyway_keeps_its_full_restore():
    # vLLM refuses it with or without the load (its whole sequence must fit the free
    # blocks): shortening the restore would only add prefill once it is admitted.
    req = _req("r", 50 * BT)
    running = _req("p", 60 * BT, RequestStatus.RUNNING, computed=BT, prefilling=True)
    assert _admission(free=30, remaining={"p": 59}).cap(req, 0, 49 * BT, [req, running]) is None


def test_unbound_admission_never_caps():
    a = Admission(BT, n_kv=1, n_state=1, max_model_len=32768)
    assert a.cap(_req("r", 20 * BT), 0, 19 * BT, []) is None
