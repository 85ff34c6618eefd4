"""Trace loaders and the `load` dispatcher.

Formats: "weka" (kv-cache-tester JSON, one session per file), "tracelab" (round JSONL),
"tracelab_csv" (replayer CSV), "mooncake" (request JSONL). `detect_format` tells them apart
by content (key names in the first line / file head), never by file name.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import msgspec

from ..model import Workload
from .common import Paths, TraceFormatError, expand_paths
from .mooncake import load_mooncake
from .tracelab import load_tracelab_csv, load_tracelab_rounds
from .weka import load_weka, load_weka_file

FORMATS = ("weka", "tracelab", "tracelab_csv", "mooncake")

_HEAD_BYTES = 1 << 20


def detect_format(path: str | Path) -> str:
    """The format of one trace file, from its content; TraceFormatError if none or several fit."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    first = head.lstrip().split(b"\n", 1)[0]
    fits = []
    if b'"requests"' in head and (b'"hash_id_scope"' in head or b'"block_size"' in head):
        fits.append("weka")
    if b'"round_index"' in first and b'"prefix_tokens"' in first:
        fits.append("tracelab")
    if b'"input_length"' in first and b'"hash_ids"' in first:
        fits.append("mooncake")
    if not first.startswith((b"{", b"[")):
        try:
            header = next(csv.reader(io.StringIO(first.decode("utf-8", "replace"))))
        except (csv.Error, StopIteration):
            header = []
        if {"prefix_len", "input_len"} <= {h.strip() for h in header}:
            fits.append("tracelab_csv")
    if len(fits) != 1:
        what = "matches several formats " + str(fits) if fits else "matches no known trace format"
        raise TraceFormatError(f"{path}: {what}; pass format= one of {FORMATS}")
    return fits[0]


_LOADERS: dict[str, Callable[..., Workload]] = {
    "weka": load_weka,
    "tracelab": load_tracelab_rounds,
    "tracelab_csv": load_tracelab_csv,
    "mooncake": load_mooncake,
}


def load(
    paths: Paths,
    format: str | None = None,
    *,
    block_size: int | None = None,
    name: str | None = None,
) -> Workload:
    """Load trace files (or directories of them) into one `Workload`.

    `format=None` detects each file's format; files of different formats may be mixed if
    their block sizes agree. `block_size`: for weka/mooncake a multiple of the native size
    (ids are coarsened); for TraceLab the size of the synthesised blocks (default 64).
    """
    files = expand_paths(paths)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {FORMATS}")
    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(format or detect_format(f), []).append(f)
    parts = []
    for fmt, fs in groups.items():
        kw = {"block_size": block_size} if block_size is not None else {}
        parts.append(_LOADERS[fmt](fs, **kw))
    if len(parts) == 1:
        wl = parts[0]
        return wl if name is None else msgspec.structs.replace(wl, name=name)
    sizes = {p.block_size for p in parts}
    if len(sizes) > 1:
        raise ValueError(
            f"cannot mix formats {list(groups)} with block sizes {[p.block_size for p in parts]};"
            " pass a common block_size"
        )
    return Workload(
        name=name or "+".join(groups),
        block_size=sizes.pop(),
        sessions=tuple(s for p in parts for s in p.sessions),
        source="; ".join(p.source for p in parts),
        arrivals="recorded" if all(p.arrivals == "recorded" for p in parts) else "synthetic",
    ).validate()


__all__ = [
    "FORMATS",
    "TraceFormatError",
    "detect_format",
    "load",
    "load_mooncake",
    "load_tracelab_csv",
    "load_tracelab_rounds",
    "load_weka",
    "load_weka_file",
]
