"""Helpers shared by the trace loaders: path expansion and error wrapping."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

PathLike = str | os.PathLike[str]
Paths = PathLike | Iterable[PathLike]

# Files a trace directory may hold that are not traces (READMEs, licences) are skipped.
TRACE_SUFFIXES = (".json", ".jsonl", ".csv")


class TraceFormatError(ValueError):
    """Malformed trace input; the message names the file and, where known, line and field."""


def expand_paths(paths: Paths) -> list[Path]:
    """Files named by `paths`; a directory stands for its trace files, sorted by name."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.is_file() and q.suffix in TRACE_SUFFIXES))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such trace file or directory: {p}")
    if not out:
        raise ValueError(f"no trace files in {', '.join(map(str, paths))}")
    return out


def decode_error(path: Path, err: Exception, line: int | None = None) -> TraceFormatError:
    """Wrap a msgspec decode/validation error with the file (and line) it came from.

    msgspec's messages already name the field, e.g. "Object missing required field `in` -
    at `$.requests[3]`".
    """
    where = f"{path}:{line}" if line is not None else str(path)
    return TraceFormatError(f"{where}: {err}")


def decode_json(path: Path, data: bytes, typ: type, line: int | None = None):
    try:
        return msgspec.json.decode(data, type=typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise decode_error(path, err, line) from None


def iter_jsonl(path: Path, decoder: msgspec.json.Decoder):
    """(line number, decoded row) for each non-blank line of a JSONL file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield lineno, decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                raise decode_error(path, err, lineno) from None
