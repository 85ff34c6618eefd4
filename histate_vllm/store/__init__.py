"""Crash-safe SSD store of KV chunks and recurrent-state checkpoints (no vllm import).

Public API: `SSDStore` (write, publish, verified reads, scan, deletes, garbage pass),
`StoreWriter` (background write queue), `StoreIdentity`, `StoreIndex`, the errors.
`python -m histate_vllm.store fsck DIR` verifies a store on disk.
"""

from histate_vllm.store.directio import aligned_buffer
from histate_vllm.store.errors import (
    ChunkConflict,
    CorruptEntry,
    MissingEntry,
    StoreError,
    StoreUnavailable,
    StoreUnusable,
)
from histate_vllm.store.format import HEADER_BYTES, ChunkRef, Manifest, StoreIdentity
from histate_vllm.store.gc import GcReport
from histate_vllm.store.restore import Read
from histate_vllm.store.scan import CheckpointInfo, StoreIndex
from histate_vllm.store.store import SSDStore
from histate_vllm.store.writer import Completion, StoreWriter

__all__ = [
    "HEADER_BYTES",
    "CheckpointInfo",
    "ChunkConflict",
    "ChunkRef",
    "Completion",
    "CorruptEntry",
    "GcReport",
    "Manifest",
    "MissingEntry",
    "Read",
    "SSDStore",
    "StoreError",
    "StoreIdentity",
    "StoreIndex",
    "StoreUnavailable",
    "StoreUnusable",
    "StoreWriter",
    "aligned_buffer",
]
