"""Restores sized to the GPU blocks that are free, so a waiting restore never stalls vLLM's queue.

vLLM admits an asynchronous load only if the blocks of the whole restored prefix fit in the
free blocks minus what in-flight prefills still need (`Scheduler._inflight_prefill_reserved_
blocks`). When they do not, `allocate_slots` fails and the scheduler stops scanning its
waiting queue: every request behind the restore waits, even ones that could run. Without
a load (vLLM alone), a request needs only its whole sequence to fit in the free blocks.

So before the connector looks a request up it asks `Admission.limit`: the most tokens whose
load fits now. The lookup then offers the deepest checkpoint within that limit (a shorter
restore, still exact: the state and every KV block before it are loaded), or nothing, and
the request is admitted on the same terms as without HiState; the tokens past the limit are
prefilled. Where even the whole sequence does not fit in the free blocks, no limit helps:
vLLM refuses the request with or without the load, and the full hit is offered.

The reservations of in-flight prefills are kept as a running total, updated where blocks
are allocated or released (`track`, `drop`), so a lookup costs O(1), not O(requests).
"""

from __future__ import annotations

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


def evictable_blocks(blocks) -> int:
    """Blocks of a GPU prefix hit (`KVCacheBlocks`) that sit in vLLM's free queue: counted
    as free, but taken out of it when the request claims its hit (vLLM's allocate_slots
    counts them as needed), so they are not free for the request's own restore."""
    return sum(1 for group in blocks.blocks for b in group if not b.is_null and b.ref_cnt == 0)


class Admission:
    def __init__(self, block_tokens: int, n_kv: int, n_state: int, max_model_len: int):
        self.block_tokens = block_tokens
        self.n_kv = n_kv
        self.n_state = n_state
        self.max_model_len = max_model_len
        self._kv_cache_manager = None
        # request id -> blocks vLLM still reserves for it (an in-flight prefill or load).
        self._reserved: dict[str, int] = {}
        self._reserved_total = 0

    def bind(self, kv_cache_manager) -> None:
        """vLLM's scheduler-side KV cache manager (`KVConnectorBase_V1.bind_kv_cache_manager`)."""
        self._kv_cache_manager = kv_cache_manager

    # --- reservations of in-flight prefills (vLLM's `_inflight_prefills`) ---

    def _remaining_blocks(self, request, computed: int) -> int:
        """Blocks `request` still needs for its whole sequence once `computed` tokens are
        done: vLLM's own count (`Scheduler._request_remaining_blocks`)."""
        kvm = self._kv_cache_manager
        full = min(request.num_tokens, self.max_model_len)
        return kvm.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=full,
            new_computed_blocks=kvm.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=computed,
            num_local_computed_tokens=computed,
            num_tokens_main_model=full,
            apply_admission_cap=True,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )

    def track(self, request, computed: int) -> None:
        """vLLM allocated blocks for `request`, which will still be prefilling (or loading)
        with `computed` tokens done: refresh its reservation."""
        if self._kv_cache_manager is None:
            return
        self._set(request.request_id, self._remaining_blocks(request, computed))

    def drop(self, request_id: str) -> None:
        """`request` is no longer an in-flight prefill (done prefilling, preempted, finished)."""
        self._set(request_id, 0)

    def _set(self, request_id: str, blocks: int) -> None:
        old = self._reserved.pop(request_id, 0)
        if blocks > 0:
            self._reserved[request_id] = blocks
        self._reserved_total += max(blocks, 0) - old

    def reserved(self, request_id: str | None = None) -> int:
        """Blocks reserved for in-flight prefills other than `request_id`."""
        return self._reserved_total - self._reserved.get(request_id, 0)

    # --- the limit ---

    def limit(self, request, local: int, own_evictable: int = 0) -> int | None:
        """Most tokens past `local` (block-aligned) the restore of `request` may cover now;
        None: no limit. `own_evictable`: blocks of the request's GPU hit that vLLM counts as
        free but the request takes when admitted (`evictable_blocks`)."""
        if self._kv_cache_manager is None:
            return None
        kvm = self._kv_cache_manager
        # vLLM keeps `watermark_blocks` free on top (scheduler watermark, 0 by default).
        free = (kvm.block_pool.get_num_free_blocks() - own_evictable
                - getattr(kvm, "watermark_blocks", 0))
        bt, n_kv, n_state = self.block_tokens, self.n_kv, self.n_state
        full = min(request.num_tokens, self.max_model_len) - local
        if load_blocks(local, full, bt, n_kv, n_state) > free:
            return None  # refused with or without the load: do not shorten it for nothing
        avail = free - self.reserved(request.request_id)
        if load_blocks(local, full, bt, n_kv, n_state) <= avail:
            return None  # any restore fits
        return fitting_tokens(local, avail, bt, n_kv, n_state)
