"""What travels from the scheduler to the worker in a transfer job (pickled each step).

One entry per offload key, in the same order as the GPU blocks of the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.kv_offload.base import LoadStoreSpec


@dataclass(frozen=True, slots=True)
class SSDWrite:
    """Copy a key staged in a DRAM slot to the SSD store.

    Sent with the step's metadata after that step's store jobs, so the worker runs it once
    the slot holds the data; the slot stays pinned until the worker reports the write."""

    key: bytes
    slot: int
    is_state: bool
    position: int
    # For a state: the KV chunk keys of every block before it (its manifest names them).
    chunk_keys: tuple[bytes, ...] = ()
    provenance: str = ""


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
