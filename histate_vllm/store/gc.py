"""Background garbage pass and disk usage.

Removes what no published checkpoint can use: files no manifest names (left by a crash
before a manifest was renamed into place, or by an eviction racing a publish), stale
temporary files, unusable manifests, and quarantine beyond its cap.

Each pass rescans, so it never acts on a stale index. A file younger than the grace
period is kept (a publish in another process may be about to name it), except garbage
that no publish can fix, and temporary files whose writer process is gone. Before each
unlink the file is checked to be the one the scan saw (same inode and mtime).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from histate_vllm.store.format import StoreIdentity
from histate_vllm.store.threads import start_thread
from histate_vllm.store.layout import Layout, pid_alive
from histate_vllm.store.quarantine import trim
from histate_vllm.store.scan import OrphanFile, scan
from histate_vllm.store.sysio import SYS

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GcReport:
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    # Orphans left in place because they are younger than the grace period.
    kept_young: int = 0
    errors: list[str] = field(default_factory=list)


def _removable(o: OrphanFile, now: float, grace_s: float) -> bool:
    if o.urgent or now - o.mtime >= grace_s:
        return True
    return o.tmp_pid is not None and o.tmp_pid != os.getpid() and not pid_alive(o.tmp_pid)


def _unlink_if_same(o: OrphanFile) -> bool:
    try:
        st = os.stat(o.path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if st.st_ino != o.ino or st.st_mtime != o.mtime:
        return False  # replaced since the scan: not the file we judged
    SYS.unlink(o.path)
    return True


def collect_garbage(
    layout: Layout, identity: StoreIdentity, *, grace_s: float, quarantine_keep: int
) -> GcReport:
    report = GcReport()
    index = scan(layout, identity, log=False)
    now = time.time()
    for o in index.orphans:
        if not _removable(o, now, grace_s):
            report.kept_young += 1
            continue
        try:
            if _unlink_if_same(o):
                report.removed.append(o.path)
                report.removed_bytes += o.nbytes
        except OSError as e:
            report.errors.append(f"{o.path}: {e.strerror}")
    report.removed_bytes += trim(layout, quarantine_keep)
    if report.errors:
        logger.warning(
            "store gc: could not remove %d file(s), first: %s",
            len(report.errors),
            report.errors[0],
        )
    return report


def usage_bytes(layout: Layout) -> int:
    """Bytes of every file under the identity directory (a walk: O(files))."""
    total = 0
    stack = [layout.dir]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except FileNotFoundError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    else:
                        total += e.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
    return total


def start_background(fn, *, delay_s: float, name: str) -> threading.Thread:
    def run() -> None:
        if delay_s > 0:
            time.sleep(delay_s)
        try:
            report = fn()
            logger.info(
                "store gc: removed %d file(s), %d bytes; kept %d young orphan(s)",
                len(report.removed),
                report.removed_bytes,
                report.kept_young,
            )
        except Exception:
            logger.exception("store gc pass failed; the store keeps working")

    return start_thread(run, name=name, writes=True)
