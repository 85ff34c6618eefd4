"""Helpers shared by the store tests (a uniquely named module, not conftest)."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from histate_vllm.store import SSDStore, StoreIdentity

IDENTITY = StoreIdentity(
    model="Qwen/Qwen3-Next-80B-A3B",
    dtype="bfloat16",
    kv_layout="NHD",
    block_size=528,
    tp_rank=0,
    tp_size=1,
    page_bytes=1 << 16,
    vllm_version="0.32.0",
)


def make_key(i: int | str, group: int = 0) -> bytes:
    """An OffloadKey: 32-byte block hash + 4-byte big-endian group index."""
    return hashlib.sha256(str(i).encode()).digest() + group.to_bytes(4, "big")


def make_payload(nbytes: int, seed: int | str) -> np.ndarray:
    s = int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(s).integers(0, 256, nbytes, dtype=np.uint8)


def read_chunk(store: SSDStore, key: bytes, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    assert store.read_chunk(key, out) == nbytes
    return out


def read_checkpoint(store: SSDStore, key: bytes, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    assert store.read_checkpoint(key, out) == nbytes
    return out


def all_files(store: SSDStore) -> list[str]:
    out = []
    for d, _, files in os.walk(store.layout.dir):
        out.extend(os.path.join(d, f) for f in files)
    return sorted(out)


def tmp_files(store: SSDStore) -> list[str]:
    return [f for f in all_files(store) if f.endswith(".tmp")]


def assert_only_published_files(store: SSDStore) -> None:
    """Every file outside quarantine/ belongs to a listed checkpoint (or is identity.json)."""
    index = store.scan()
    assert index.skipped == [] and index.orphans == []
    layout = store.layout
    expected = {layout.identity_path}
    for key, info in index.checkpoints.items():
        expected.add(layout.manifest_path(key))
        expected.add(layout.state_path(key, store.load_manifest(key).state_file))
        expected.update(layout.chunk_path(k) for k in info.chunk_keys)
    present = {f for f in all_files(store) if not f.startswith(layout.quarantine_dir)}
    assert present == expected
