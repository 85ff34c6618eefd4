"""Restores sized to the GPU blocks that are free, so a waiting restore never stalls vLLM's queue.

vLLM admits an asynchronous load only if the blocks of the whole restored prefix fit in the
free blocks minus what in-flight prefills still need (`Scheduler._inflight_prefill_reserved_
blocks`). When they do not, `allocate_slots` fails and the scheduler stops scanning its
waiting queue: every request behind the restore waits, even ones that could run. Without
a load (vLLM alone), a request needs only its whole sequence to fit in the free blocks.

So before offering a hit the connector asks `Admission.cap`: the most tokens whose load fits
now. The connector then offers the deepest checkpoint within that cap (a shorter restore,
still exact: the state and every KV block before it are loaded), or nothing, and the
request is admitted on the same terms as without HiState; the tokens past the cap are
prefilled. Where even the whole sequence does not fit in the free blocks, no cap helps:
vLLM refuses the request with or without the load, and the full hit is offered.
"""

from __future__ import annotations

from vllm.v1.request import RequestStatus

# Blocks a recurrent-state group takes for a restored prefix in vLLM's "align" mode: the
# state block at the hit, plus one for a prefill checkpoint (MambaManager's physical cap).
STATE_BLOCKS = 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load_blocks(local: int, tokens: int, block_tokens: int, n_kv: int, n_state: int) -> int:
    """GPU blocks a restore of `tokens` tokens after a `local`-token GPU hit allocates."""
    kv = _cdiv(local + tokens, block_tokens) - local // block_tokens
    return n_kv * kv + (n_state * STATE_BLOCKS if tokens else 0)


def fitting_tokens(local: int, avail: int, block_tokens: int, n_kv: int, n_state: int) -> int:
    """The most tokens (whole blocks) whose restore after `local` takes at most `avail`."""
    blocks = avail - n_state * STATE_BLOCKS
    if blocks <= 0 or n_kv == 0:
        return 0
    return blocks // n_kv * block_tokens


def _in_flight_prefill(request) -> bool:
    """Whether vLLM reserves blocks for `request` (its `_inflight_prefills`): an async load
    in flight or landed, or a prefill that has started and not finished."""
    status = request.status
    if status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        return True
    if status == RequestStatus.RUNNING:
        # is_prefill_chunk is updated after each scheduling pass: one admitted earlier in
        # this pass still shows its computed tokens only.
        return bool(getattr(request, "is_prefill_chunk", False)) or (
            request.num_computed_tokens < request.num_prompt_tokens)
    return status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and (
        0 < request.num_computed_tokens < request.num_tokens)


class Admission:
    def __init__(self, block_tokens: int, n_kv: int, n_state: int, max_model_len: int):
        self.block_tokens = block_tokens
        self.n_kv = n_kv
        self.n_state = n_state
        self.max_model_len = max_model_len
        self._kv_cache_manager = None

    def bind(self, kv_cache_manager) -> None:
        """vLLM's scheduler-side KV cache manager (`KVConnectorBase_V1.bind_kv_cache_manager`)."""
        self._kv_cache_manager = kv_cache_manager

    def _remaining_blocks(self, request) -> int:
        """Blocks `request` still needs for its whole sequence: vLLM's own count
        (`Scheduler._request_remaining_blocks`), the reservation it keeps for it."""
        kvm = self._kv_cache_manager
        full = min(request.num_tokens, self.max_model_len)
        return kvm.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=full,
            new_computed_blocks=kvm.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=request.num_computed_tokens,
            num_local_computed_tokens=request.num_computed_tokens,
            num_tokens_main_model=full,
            apply_admission_cap=True,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )

    def cap(self, request, local: int, hit: int, live_requests) -> int | None:
        """Most tokens past `local` the restore of `request` may cover now (None: no cap).

        `live_requests`: every request the scheduler holds (their reservations count)."""
        if self._kv_cache_manager is None or hit <= 0:
            return None
        free = self._kv_cache_manager.block_pool.get_num_free_blocks()
        bt, n_kv, n_state = self.block_tokens, self.n_kv, self.n_state
        full = min(request.num_tokens, self.max_model_len) - local
        if load_blocks(local, full, bt, n_kv, n_state) > free:
            return None  # refused with or without the load: do not shorten it for nothing
        reserved = sum(self._remaining_blocks(r) for r in live_requests
                       if r is not request and _in_flight_prefill(r))
        avail = free - reserved
        if load_blocks(local, hit, bt, n_kv, n_state) <= avail:
            return None
        return min(hit, fitting_tokens(local, avail, bt, n_kv, n_state))
