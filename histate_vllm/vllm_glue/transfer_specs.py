"""What travels from the scheduler to the worker in a transfer job (pickled each step).

One entry per offload key, in the same order as the GPU blocks of the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import LoadStoreSpec

from histate_vllm.bookkeeping.orchestration import SSDWrite  # noqa: F401  (sent to the worker)


@dataclass(frozen=True)
class SSDDelete:
    """Delete a key from every rank's store: the scheduler's eviction, applied by each
    worker to its own shard, in order with the writes around it."""

    key: bytes
    is_state: bool


@dataclass(frozen=True)
class SSDReset:
    """Forget every entry (a connector reset): later entries go to the store of
    `generation`, a fresh directory; the old one is deleted."""

    generation: str


@dataclass
class HiStateStoreSpec(LoadStoreSpec):
    # DRAM slot for each key.
    slots: list[int]


@dataclass
class HiStateLoadSpec(LoadStoreSpec):
    # Per key: a DRAM slot, or -1 to read it from the SSD store.
    slots: list[int]
    keys: list[bytes]
    is_state: list[bool]
    # Per key read from SSD: a DRAM slot the read also fills (promotion), or -1. Empty: none.
    fill: list[int] = field(default_factory=list)
