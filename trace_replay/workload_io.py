"""Save and load a `Workload` exactly (ids included), e.g. a generated synthetic workload.

Format: msgpack (msgspec) with block ids as little-endian int64 bytes; extension `.workload`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from .model import Workload

SUFFIX = ".workload"
_MAGIC = b"trace_replay.workload.v1"


class _File(msgspec.Struct):
    magic: bytes
    workload: Workload


def _enc(obj):
    if isinstance(obj, np.ndarray):
        return obj.astype("<i8").tobytes()
    raise NotImplementedError(f"cannot encode {type(obj)}")


def _dec(typ, obj):
    if typ is np.ndarray:
        return np.frombuffer(obj, dtype="<i8").astype(np.int64)
    raise NotImplementedError(f"cannot decode {typ}")


def save_workload(workload: Workload, path: str | Path) -> Path:
    path = Path(path)
    path.write_bytes(msgspec.msgpack.Encoder(enc_hook=_enc).encode(_File(_MAGIC, workload)))
    return path


def is_workload_file(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix == SUFFIX:
        return True
    try:
        with open(path, "rb") as f:
            return _MAGIC in f.read(64)
    except OSError:
        return False


def load_workload(path: str | Path) -> Workload:
    data = Path(path).read_bytes()
    f = msgspec.msgpack.Decoder(_File, dec_hook=_dec).decode(data)
    if f.magic != _MAGIC:
        raise ValueError(f"{path}: not a trace_replay workload file")
    return f.workload.validate()
