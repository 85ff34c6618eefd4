"""Low-level file operations of the store: the crash-safe write and the verified read.

Durability: durable. `write_atomic` writes a temporary name (O_EXCL), checks for short
writes, fsyncs the file, renames it into place and fsyncs the directory, so after a crash
a final name holds either nothing or the whole file. Any failure removes the temporary
file and leaves the final name as it was. Written files are dropped from the page cache
once synced: the store is the cold tier, not a cache of itself.

Payload files are written with O_DIRECT where the file system allows it (`directio`),
buffered otherwise. Every system call goes through `sysio.SYS`, the seam that
fault-injection tests patch.
"""

from __future__ import annotations

import errno
import os
import stat

from histate_vllm.store.directio import DirectIOUnsupported, write_direct
from histate_vllm.store.errors import StoreError, StoreUnavailable
from histate_vllm.store.layout import tmp_path
from histate_vllm.store.sysio import SYS
from histate_vllm.store.trust import DIR_MODE, FILE_MODE

# Buffered writes (no O_DIRECT) go out in pieces of this size, each followed by a hint
# that starts its writeback at once (posix_fadvise DONTNEED), so the disk works while
# the next piece is copied into the page cache. On this project's VM disk: plain
# buffered write + fsync ~290 MiB/s, with the hint every 8 MiB ~1,000 MiB/s (medians
# of 5; very noisy); 2 MiB and 16 MiB pieces were slower than 8 MiB.
_WRITE_PIECE = 8 << 20

_UNAVAILABLE = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied (read-only directory?)",
    errno.EPERM: "operation not permitted (read-only directory?)",
    errno.EIO: "I/O error",
}


def classify(e: OSError, what: str) -> StoreError:
    """Turn an OSError from a write path into the StoreError the caller handles."""
    reason = _UNAVAILABLE.get(e.errno or 0)
    if reason is not None:
        return StoreUnavailable(reason, e.errno, f"{what}: {e.strerror}")
    return StoreError(f"{what} failed: {e}")


def fsync_dir(path: str) -> None:
    fd = SYS.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        SYS.fsync(fd)
    finally:
        SYS.close(fd)


def make_dir(path: str, *, fsync: bool) -> None:
    """Create `path` (one level, 0700) if missing, and make its entry durable.

    An existing `path` must be a real directory: one replaced by a symlink (the store
    never makes any) would lead writes and deletes outside the store.
    """
    try:
        SYS.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory (a symlink?)", path)
        return
    os.chmod(path, DIR_MODE)  # a umask may strip owner bits; never more than 0700
    if fsync:
        fsync_dir(os.path.dirname(path))


def _write_all(fd: int, buf: memoryview, file_off: int) -> None:
    off = 0
    while off < len(buf):
        n = SYS.write(fd, buf[off : off + _WRITE_PIECE])
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        if n >= _WRITE_PIECE // 2:
            os.posix_fadvise(fd, file_off + off, n, os.POSIX_FADV_DONTNEED)
        off += n


def write_atomic(final: str, parts: list, *, fsync: bool, sync_dir: bool = True) -> int:
    """Write the concatenation of `parts` (buffers) to `final`; return its size.

    With `sync_dir=False` the caller fsyncs the directory itself, and knows that an
    error raised here means `final` was not replaced.
    """
    tmp = tmp_path(final)
    fd = SYS.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    total = 0
    try:
        try:
            for part in parts:
                mv = memoryview(part).cast("B")
                _write_all(fd, mv, total)
                total += len(mv)
            if fsync:
                SYS.fsync(fd)
                # The store is not a page cache: the tiers above it hold what is hot.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            SYS.close(fd)
        SYS.rename(tmp, final)
    except BaseException:
        remove_quietly(tmp)
        raise
    if fsync and sync_dir:
        fsync_dir(os.path.dirname(final))
    return total


def write_payload_atomic(
    final: str,
    header: bytes,
    payload: memoryview,
    *,
    fsync: bool,
    direct: bool,
    sync_dir: bool = True,
) -> int:
    """`write_atomic` of header + payload, with O_DIRECT if `direct`.

    Raises DirectIOUnsupported (nothing left behind) if the file system refuses it.
    """
    if not direct:
        return write_atomic(final, [header, payload], fsync=fsync, sync_dir=sync_dir)
    tmp = tmp_path(final)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT
    try:
        fd = SYS.open(tmp, flags, FILE_MODE)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise DirectIOUnsupported(str(e)) from None
        raise
    try:
        try:
            total = write_direct(fd, header, payload)
            if fsync:
                SYS.fsync(fd)
        finally:
            SYS.close(fd)
        SYS.rename(tmp, final)
    except BaseException:
        remove_quietly(tmp)
        raise
    if fsync and sync_dir:
        fsync_dir(os.path.dirname(final))
    return total


def remove_quietly(path: str) -> bool:
    """Unlink `path`; a failure to clean up never masks the error that caused it."""
    try:
        SYS.unlink(path)
        return True
    except OSError:
        return False


def read_exact(fd: int, bufs: list[memoryview], offset: int) -> int:
    """Fill `bufs` in order from `offset`; return bytes read (fewer only at EOF)."""
    want = sum(len(b) for b in bufs)
    done = 0
    while done < want:
        n = os.preadv(fd, bufs, offset + done)
        if n <= 0:
            break
        done += n
        while bufs and n >= len(bufs[0]):  # drop what is full, resume inside the next
            n -= len(bufs[0])
            bufs = bufs[1:]
        if bufs and n:
            bufs = [bufs[0][n:], *bufs[1:]]
    return done


def file_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None
