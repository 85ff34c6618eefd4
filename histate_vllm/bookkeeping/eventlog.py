"""The on-disk event log: every policy event and every request's lookup, bounded and rotated.

Files in the log directory (`events.log` and, after rotation, `events.log.1`; at most
`keep` files of `max_bytes` each, the oldest deleted): frames of a 4-byte big-endian length
and a msgpack `Batch`. The engine thread only appends to a list; a daemon thread encodes
and writes once a second, so the log never stalls a step. A crash can tear the last frame:
readers stop there. `read_log` returns everything in order, oldest first.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Iterator, Sequence

import msgspec
import numpy as np
import xxhash

from histate_vllm.policy.events import Event
from histate_vllm.store.trust import FILE_MODE, make_private_dirs

LOG_NAME = "events.log"
_LEN = struct.Struct(">I")
MAX_PENDING = 200_000  # records held for the writer thread before the oldest are dropped


class Lookup(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One request's lookup: what vLLM resumed from and, for a miss, why not more."""

    t: float
    request_id: str
    prompt_tokens: int
    block_tokens: int
    covered: int  # tokens vLLM resumes from (GPU prefix cache + HiState)
    gpu: int  # of which the GPU prefix cache served
    position: int  # deepest checkpoint HiState could restore
    shared: int  # tokens whose KV HiState holds
    cause: str = ""  # miss cause (telemetry.py), "" when not a miss
    missed: int = 0
    # Chained xxh64 of the prompt's token ids at each block end, seeded with its cache_salt
    # and LoRA adapter (`scope_seed`): matches a prompt file of the same salt and adapter.
    fps: list[int] = []
    # The prompt's block hashes (the policy's node ids), one per block.
    nodes: list[bytes] = []


class Batch(msgspec.Struct, omit_defaults=True):
    events: list[Event] = []
    lookups: list[Lookup] = []


def scope_seed(cache_salt: str | None = None, lora_name: str | None = None) -> int:
    """The seed of a prompt's fingerprint chain: the cache_salt and LoRA adapter vLLM
    salts its block hashes with. One prompt under salts A, B and none gets three unrelated
    chains, so the log keeps tenants apart as the prefix cache does, and `inspect why`
    compares within one salt and adapter. 0 with neither (fingerprints as before)."""
    if not cache_salt and not lora_name:
        return 0
    return xxhash.xxh64_intdigest(msgspec.json.encode([cache_salt or "", lora_name or ""]))


def request_scope(request) -> int:
    """`scope_seed` of a vLLM request (its cache_salt and LoRA adapter name)."""
    lora = getattr(request, "lora_request", None)
    return scope_seed(getattr(request, "cache_salt", None),
                      getattr(lora, "lora_name", None) if lora is not None else None)


def fingerprints(token_ids: Sequence[int], block_tokens: int, limit: int | None = None,
                 seed: int = 0) -> list[int]:
    """Chained xxh64 of the token ids up to each full block (one per block), from `seed`
    (`scope_seed`)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    n = len(ids) // block_tokens if limit is None else min(limit, len(ids) // block_tokens)
    out, h = [], seed
    for b in range(n):
        h = xxhash.xxh64_intdigest(ids[b * block_tokens : (b + 1) * block_tokens].tobytes(),
                                   seed=h)
        out.append(h)
    return out


class EventLogWriter:
    def __init__(self, directory: str, max_bytes: int = 16 << 20, keep: int = 2,
                 interval: float = 1.0):
        make_private_dirs(directory)  # the log names every request's prompt blocks
        self.directory = directory
        self.path = os.path.join(directory, LOG_NAME)
        self.max_bytes = max_bytes
        self.keep = max(1, keep)
        self.interval = interval
        self.dropped = 0
        self._events: list[Event] = []
        self._lookups: list[Lookup] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._encoder = msgspec.msgpack.Encoder()
        self._thread = threading.Thread(target=self._run, name="histate-eventlog", daemon=True)
        self._thread.start()

    def append(self, events: Sequence[Event] = (), lookups: Sequence[Lookup] = ()) -> None:
        with self._lock:
            self._events.extend(events)
            self._lookups.extend(lookups)
            over = len(self._events) + len(self._lookups) - MAX_PENDING
            if over > 0:  # the disk cannot keep up: lose the oldest events, keep lookups
                cut = min(over, len(self._events))
                del self._events[:cut]
                self.dropped += cut

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            lookups, self._lookups = self._lookups, []
        if not (events or lookups):
            return
        data = self._encoder.encode(Batch(events=events, lookups=lookups))
        try:
            self._rotate_if_needed(len(data))
            # O_NOFOLLOW: a planted link would have this append to its target.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW, FILE_MODE)
            try:
                os.write(fd, _LEN.pack(len(data)) + data)
            finally:
                os.close(fd)
        except OSError:
            self.dropped += len(events) + len(lookups)  # a full or failed disk loses the log

    def _rotate_if_needed(self, incoming: int) -> None:
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return
        if size + incoming + _LEN.size <= self.max_bytes:
            return
        for i in range(self.keep - 1, 0, -1):
            src = self.path if i == 1 else f"{self.path}.{i - 1}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i}")
        if self.keep == 1:
            os.remove(self.path)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()


def _frames(path: str) -> Iterator[bytes]:
    """The frames of one log file; nothing from a symlink, FIFO or device (the writer
    makes none, and /dev/zero would never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # missing, or a symlink (ELOOP) or socket
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return
    finally:
        os.close(fd)
    off = 0
    while off + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, off)
        if off + _LEN.size + n > len(data):
            return  # torn by a crash
        yield data[off + _LEN.size : off + _LEN.size + n]
        off += _LEN.size + n


def log_files(directory: str) -> list[str]:
    """The log's files, oldest first."""
    base = os.path.join(directory, LOG_NAME)
    rotated = sorted((f for f in os.listdir(directory) if f.startswith(LOG_NAME + ".")),
                     key=lambda f: -int(f.rsplit(".", 1)[1]) if f.rsplit(".", 1)[1].isdigit()
                     else 0)
    return [os.path.join(directory, f) for f in rotated] + [base]


def read_log(directory: str) -> tuple[list[Event], list[Lookup]]:
    decoder = msgspec.msgpack.Decoder(Batch)
    events: list[Event] = []
    lookups: list[Lookup] = []
    if not os.path.isdir(directory):
        return events, lookups
    for path in log_files(directory):
        for frame in _frames(path):
            try:
                batch = decoder.decode(frame)
            except msgspec.DecodeError:
                break
            events.extend(batch.events)
            lookups.extend(batch.lookups)
    return events, lookups
