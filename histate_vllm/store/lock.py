"""One engine per store directory: an exclusive advisory lock held for the engine's life.

Two engines writing one identity directory would keep separate books and budgets and
delete each other's entries. The scheduler takes `flock(LOCK_EX | LOCK_NB)` on
`<identity dir>/engine.lock` at start-up and keeps the descriptor open; the kernel drops
the lock when the process exits, however it exits, so a crash never leaves a stale lock.
The holder writes its pid and host into the file, only to name it in the error.

flock is local to one host on most network file systems: keep `ssd_dir` on a local disk.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

from histate_vllm.store.errors import StoreError
from histate_vllm.store.trust import FILE_MODE

LOCK_FILE = "engine.lock"


class StoreLocked(StoreError):
    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(
            f"SSD store {os.path.dirname(path)} is in use by another engine ({holder}). "
            "Engines cannot share one store directory: give each its own 'ssd_dir' (and "
            "its share of the disk budget), or stop the other engine first"
        )


class DirLock:
    """An exclusive lock on a store directory, held until `release()` or process exit."""

    def __init__(self, directory: str, *, wait_s: float = 0.0) -> None:
        """wait_s: how long to retry while another process holds it (an engine being
        restarted may still be exiting)."""
        self.path = os.path.join(directory, LOCK_FILE)
        # O_NOFOLLOW: a planted link would have this open (and truncate) its target.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     FILE_MODE)
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.1)
        except BlockingIOError:
            try:
                holder = os.read(fd, 256).decode(errors="replace").strip() or "pid unknown"
            finally:
                os.close(fd)
            raise StoreLocked(self.path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor drops the lock
