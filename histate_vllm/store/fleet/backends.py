"""Where fleet objects live: a shared POSIX directory or Mooncake Store.

Both offer the same five calls on named byte objects: `put` (create if absent: the first
writer's bytes stay, as with Mooncake's own `put`), `upsert` (replace), `get` (None when
absent), `exists` (many names at once) and `remove`. A backend that cannot be reached
raises `FleetUnavailable`, one that is full or refuses a write raises `FleetWriteFailed`;
neither ever blocks an engine step (the tier calls them from its own threads).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import time
from pathlib import Path


class FleetUnavailable(OSError):
    """The backend cannot be reached now (master down, mount gone)."""


class FleetWriteFailed(OSError):
    """The backend refused a write (full, read-only, object too large)."""


class DirBackend:
    """Objects as files under `root`, a directory every engine mounts (NFS, Lustre, WekaFS,
    a 3FS mount). No lock is taken: a file is written under a temporary name and then
    linked (`put`: fails if the name exists, so the first writer's bytes stay) or renamed
    (`upsert`) into place, both atomic within a directory on POSIX file systems, so a
    reader sees a whole object or none. Over `budget_bytes` the oldest objects (by
    modification time; a read refreshes it) are removed: each engine evicts by what it
    sees, and a checkpoint whose objects went is a miss, never a wrong restore."""

    def __init__(self, root: str | os.PathLike, budget_bytes: int, *, fsync: bool = True):
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FleetUnavailable(e.errno, f"fleet directory {self.root}: {e.strerror}") from None
        self._usage = self._scan_usage()

    def _path(self, name: str) -> Path:
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"object name {name!r} leaves the fleet directory")
        return self.root / name

    def _scan_usage(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def _write_tmp(self, path: Path, data) -> Path:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                if self.fsync:
                    os.fsync(f.fileno())
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno in (errno.ENOENT, errno.ESTALE, errno.EIO, errno.ENOTCONN):
                raise FleetUnavailable(e.errno, f"fleet directory: {e.strerror}") from None
            raise FleetWriteFailed(e.errno, f"fleet directory: {e.strerror}") from None
        return tmp

    def put(self, name: str, data) -> None:
        """Store `data` as `name` unless it exists."""
        path = self._path(name)
        if path.exists():
            return
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return
        except OSError as e:
            raise FleetWriteFailed(e.errno, f"fleet directory: {e.strerror}") from None
        finally:
            tmp.unlink(missing_ok=True)
        self._added(len(data))

    def upsert(self, name: str, data) -> None:
        path = self._path(name)
        tmp = self._write_tmp(path, data)
        try:
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise FleetWriteFailed(e.errno, f"fleet directory: {e.strerror}") from None
        self._added(len(data))

    def get(self, name: str) -> bytes | None:
        path = self._path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise FleetUnavailable(e.errno, f"fleet directory: {e.strerror}") from None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass  # read-only mount: eviction order is only a preference
        return data

    def exists(self, names: list[str]) -> list[bool]:
        return [self._path(n).exists() for n in names]

    def remove(self, name: str) -> None:
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            pass

    def _added(self, nbytes: int) -> None:
        self._usage += nbytes
        if self._usage > self.budget_bytes:
            self.evict(int(self.budget_bytes * 0.9))

    def evict(self, target_bytes: int) -> int:
        """Remove the least recently used objects until at most `target_bytes` remain;
        returns how many went. Temporary files of writes in flight are left alone."""
        files = []
        for p in self.root.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                st = p.stat()
                files.append((st.st_mtime_ns, st.st_size, p))
        usage = sum(f[1] for f in files)
        removed = 0
        for _, size, p in sorted(files):
            if usage <= target_bytes:
                break
            p.unlink(missing_ok=True)
            usage -= size
            removed += 1
        self._usage = usage
        return removed


class MooncakeBackend:
    """Objects in Mooncake Store (its master, its metadata server, segments of memory that
    engines or long-lived `mooncake_client` processes mount).

    An object lives in the segment of the process that mounted it: an engine that mounts
    none (`segment_bytes=0`) and writes into a `mooncake_client`'s segment leaves its
    objects behind when it dies, which is what a session moving to another engine needs.
    With the master down every call fails after a timeout of Mooncake's (about 4 s): after
    one failure the backend answers `FleetUnavailable` at once for `retry_s`, then tries
    again. A restarted master has lost every object (a miss, not an error)."""

    def __init__(self, master: str, metadata_server: str, *, local_hostname: str = "127.0.0.1",
                 segment_bytes: int = 0, buffer_bytes: int = 64 << 20, protocol: str = "tcp",
                 device: str = "", retry_s: float = 5.0, lazy: bool = False):
        """`lazy`: a master unreachable now is not an error: the first call every
        `retry_s` tries to connect again (an engine started during an outage joins the
        tier once its master is back); otherwise FleetUnavailable at once."""
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise FleetUnavailable(errno.ENOPKG, "Mooncake Store is not installed "
                                   "(pip install 'histate-vllm[fleet]')") from e
        self._new_store = MooncakeDistributedStore
        self._setup = (local_hostname, metadata_server, segment_bytes, buffer_bytes,
                       protocol, device, master)
        self.master = master
        self.retry_s = retry_s
        self._down_until = 0.0
        self._store = None
        try:
            self._connect()
        except FleetUnavailable:
            if not lazy:
                raise

    def _connect(self) -> None:
        # Mooncake's setup retries a master it cannot reach 20 times, about 90 s in all:
        # one connect says at once whether anything listens there.
        host, _, port = self.master.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
            store = self._new_store()
            rc = store.setup(*self._setup)
        except (OSError, ValueError) as e:
            self._down_until = time.monotonic() + self.retry_s
            raise FleetUnavailable(errno.ECONNREFUSED,
                                   f"Mooncake master {self.master} unreachable: {e}") from None
        if rc != 0:
            self._down_until = time.monotonic() + self.retry_s
            raise FleetUnavailable(errno.ECONNREFUSED,
                                   f"Mooncake Store at {self.master}: setup returned {rc}")
        self._store = store

    def _check(self) -> None:
        if time.monotonic() < self._down_until:
            raise FleetUnavailable(errno.ECONNREFUSED, "Mooncake master unreachable (recently)")
        if self._store is None:
            self._connect()

    def _failed(self, rc: int, what: str):
        # Mooncake's error codes: -600 no space, -900 RPC to the master failed.
        if rc == -900 or rc <= -1000:
            self._down_until = time.monotonic() + self.retry_s
            return FleetUnavailable(errno.ECONNREFUSED, f"Mooncake {what}: error {rc}")
        return FleetWriteFailed(errno.ENOSPC if rc == -600 else errno.EIO,
                                f"Mooncake {what}: error {rc}")

    def put(self, name: str, data) -> None:
        self._check()
        rc = self._store.put(name, bytes(data))  # an existing object keeps its bytes
        if rc != 0:
            raise self._failed(rc, f"put {name}")

    def upsert(self, name: str, data) -> None:
        self._check()
        rc = self._store.upsert(name, bytes(data))
        if rc != 0:
            raise self._failed(rc, f"upsert {name}")

    def get(self, name: str) -> bytes | None:
        self._check()
        data = self._store.get(name)
        if data:
            return bytes(data)
        # Empty: absent, or the master is down. Ask which (an empty object is never stored).
        if self.exists([name])[0]:
            raise FleetUnavailable(errno.EIO, f"Mooncake get {name}: no bytes")
        return None

    def exists(self, names: list[str]) -> list[bool]:
        self._check()
        answers = self._store.batch_is_exist(list(names))
        bad = [rc for rc in answers if rc < 0]
        if bad:
            raise self._failed(bad[0], "is_exist")
        return [rc == 1 for rc in answers]

    def remove(self, name: str) -> None:
        self._check()
        self._store.remove(name)  # an object in use (leased) stays: it is evicted later

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
