"""What the weights are, by their bytes: a content digest of a model's files, cached.

The store identity must change whenever the bytes of the weights change, whatever their
size and timestamps (weights rewritten in place with the old mtime, `cp -p`, `rsync -t`,
Nix store paths and reproducible container layers all keep them). So every file is read and
hashed (xxh3-128: ~10 GB/s per core here, faster than an NVMe drive reads, and several
files are read in parallel), once per change: the digest of each file is cached, keyed on
what no rewrite of the file can keep - its device and inode, size, mtime and ctime
(ctime is set by the kernel on every write, rename or metadata change, and cannot be set
back). A cache entry that does not match all five is recomputed.

The digest detects any change of the bytes; it is not a cryptographic commitment (whoever
can write the weights can do worse than forge a collision). The cache lives under the SSD
store's root (`weights-digests.json`), taken under a file lock so the engine's processes,
which all compute the identity at start-up, hash each file once between them.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import xxhash

CACHE_FILE = "weights-digests.json"
LOCK_FILE = "weights-digests.lock"
_CHUNK = 16 << 20
_THREADS = 4
# The kernel stamps ctime from a coarse clock (a few ms): a file changed this recently
# could change again with the same stamp, so its digest is not cached (as git treats
# "racily clean" files). Weights are written long before an engine starts.
RACY_S = 2.0


@dataclass
class DigestReport:
    files: int = 0
    bytes_hashed: int = 0  # read and hashed now
    bytes_cached: int = 0  # known from the cache (unchanged since hashed)
    seconds: float = 0.0


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_digest(path: str | Path) -> str:
    """xxh3-128 of a file's bytes, read in large chunks (the hash releases the GIL)."""
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def files_digest(files: list[Path], cache_dir: str | None) -> tuple[str, DigestReport]:
    """One digest of these files' names and bytes (order as given), and what it cost.

    `cache_dir`: where the per-file cache lives (created if missing); None, or a
    directory that cannot be written, hashes every file without caching."""
    t0 = time.perf_counter()
    report = DigestReport(files=len(files))
    lock_fd = _lock(cache_dir)
    try:
        cache = _load(cache_dir) if lock_fd is not None else {}
        stats = [f.stat() for f in files]  # follows symlinks (hub snapshots)
        names = [str(f.resolve()) for f in files]  # cache keys: the files' real paths
        digests: dict[int, str] = {}
        todo = []
        for i, st in enumerate(stats):
            entry = cache.get(names[i])
            if isinstance(entry, dict) and entry.get("stat") == _stat_key(st):
                digests[i] = entry["digest"]
                report.bytes_cached += st.st_size
            else:
                todo.append(i)
        if todo:
            with ThreadPoolExecutor(min(_THREADS, len(todo))) as pool:
                for i, d in zip(todo, pool.map(lambda i: file_digest(files[i]), todo)):
                    digests[i] = d
                    report.bytes_hashed += stats[i].st_size
            now = time.time()
            for i in todo:
                # Re-stat: a file rewritten while it was read gets no cache entry.
                if (_stat_key(files[i].stat()) == _stat_key(stats[i])
                        and now - stats[i].st_ctime >= RACY_S):
                    cache[names[i]] = {"stat": _stat_key(stats[i]), "digest": digests[i]}
            if lock_fd is not None:
                _save(cache_dir, cache)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    h = xxhash.xxh3_128()
    for i, f in enumerate(files):
        h.update(f"{f.name}:{digests[i]}\n".encode())
    report.seconds = time.perf_counter() - t0
    return h.hexdigest(), report


def _lock(cache_dir: str | None) -> int | None:
    if cache_dir is None:
        return None
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(cache_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None  # read-only or missing disk: hash without a cache
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process hashing the same files: wait for it
    return fd


def _load(cache_dir: str) -> dict:
    try:
        with open(os.path.join(cache_dir, CACHE_FILE), "rb") as f:
            data = json.loads(f.read(16 << 20))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or torn: recomputed


def _save(cache_dir: str, cache: dict) -> None:
    path = os.path.join(cache_dir, CACHE_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(cache, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
