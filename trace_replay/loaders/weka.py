"""Loader for WEKA's Claude Code traces (kv-cache-tester `traces/trace_NNNN.json`).

One file is one session. Its `hash_ids` are per-64-token block ids that are local to the
file; the file promises "equal id = equal block content and equal prefix" (true for all 56
shipped files), but we do not rely on it: ids are re-chained in namespace
"weka:<file id>", so `block_hashes[i]` identifies the whole prefix and ids of different
files never collide. A subagent (a `"subagent"` entry with its own nested `requests`, whose
`t` is relative to the subagent start) becomes its own `Session` in the *same* namespace
(its ids are comparable with the parent's), starting at `parent.start + entry.t`.

Data notes:
* `len(hash_ids) == in // 64` in the shipped files (full blocks only), although the README
  says ceil; both are accepted, a trailing partial-block id is dropped.
* `think_time` is missing on 2 requests; it is then rebuilt as
  `t - t_prev - api_time_prev` (the relation the other requests satisfy to within 1 s).
* Main sessions all start at 0: the files carry no absolute time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from ..hashing import Chainer, namespace_seed
from ..model import Request, Session, Workload, coarsen
from .common import Paths, TraceFormatError, decode_json, expand_paths

NATIVE_BLOCK_SIZE = 64

_NonNeg = Annotated[int, msgspec.Meta(ge=0)]
_Seconds = Annotated[float, msgspec.Meta(ge=0)]


class _Call(msgspec.Struct, tag_field="type"):
    t: _Seconds
    in_: _NonNeg = msgspec.field(name="in")
    out: _NonNeg
    hash_ids: list[_NonNeg]
    think_time: float | None = None
    api_time: float | None = None


class _CallN(_Call, tag="n"):
    pass


class _CallS(_Call, tag="s"):
    pass


class _Subagent(msgspec.Struct, tag_field="type", tag="subagent"):
    t: _Seconds
    agent_id: str
    requests: list[_Entry]
    subagent_type: str = ""


_Entry = _CallN | _CallS | _Subagent


class _File(msgspec.Struct):
    id: str
    requests: list[_Entry]
    block_size: Annotated[int, msgspec.Meta(gt=0)] = NATIVE_BLOCK_SIZE
    system_tokens: _NonNeg = 0
    tool_tokens: _NonNeg = 0


def load_weka_file(path: str | Path) -> Workload:
    """One Weka file: its main session followed by its subagent sessions (depth-first)."""
    path = Path(path)
    raw: _File = decode_json(path, path.read_bytes(), _File)
    seed = namespace_seed("weka", raw.id)
    sessions: list[Session] = []
    _build(path, raw, raw.requests, seed, raw.id, 0.0, None, None, "$", sessions)
    return Workload(
        name=raw.id, block_size=raw.block_size, sessions=tuple(sessions), source=str(path)
    )


def _build(path, raw, entries, seed, sid, start, parent, agent_id, where, out) -> None:
    chainer = Chainer(seed)
    bs = raw.block_size
    kind = "main" if parent is None else "subagent"
    # The session's tools and system prompt come first in every main prompt, in that order
    # (a subagent's own are not recorded). Both ends are the client's breakpoints, the
    # sections it reuses: a new conversation of the same agent leaves the old one where the
    # tools end.
    message_end = raw.system_tokens + raw.tool_tokens if parent is None else 0
    breakpoints = tuple(sorted({raw.tool_tokens, message_end} - {0})) if parent is None else ()
    requests: list[Request] = []
    children: list[tuple[_Subagent, str]] = []
    prev: _Call | None = None
    for i, e in enumerate(entries):
        at = f"{where}.requests[{i}]"
        if isinstance(e, _Subagent):
            children.append((e, at))
            continue
        ids = e.hash_ids
        full = e.in_ // bs
        if len(ids) == full + 1 and e.in_ % bs:
            ids = ids[:full]  # README's ceil convention: drop the partial block
        elif len(ids) != full:
            raise TraceFormatError(
                f"{path}: {at}.hash_ids has {len(ids)} ids for in={e.in_} (block_size {bs})"
            )
        if e.think_time is not None:
            think = e.think_time
        elif prev is None:
            think = 0.0
        else:
            think = e.t - prev.t - (prev.api_time or 0.0)
        requests.append(
            Request(
                session_id=sid,
                index=len(requests),
                t=e.t,
                think_time=max(0.0, think),
                input_tokens=e.in_,
                output_tokens=e.out,
                block_hashes=chainer.chain(ids),
                kind=kind,
                agent_id=agent_id,
                label=type(e).__struct_config__.tag,
                api_time=e.api_time,
                message_end=message_end,
                breakpoints=breakpoints,
            )
        )
        prev = e
    out.append(
        Session(
            id=sid,
            start=start,
            requests=tuple(requests),
            kind=kind,
            parent=parent,
            agent_id=agent_id,
            source=f"{path}:{where}",
        )
    )
    for e, at in children:
        _build(
            path,
            raw,
            e.requests,
            seed,
            f"{sid}/{e.agent_id}",
            start + e.t,
            sid,
            e.agent_id,
            at,
            out,
        )


def load_weka(paths: Paths, *, block_size: int | None = None, name: str = "weka") -> Workload:
    """All sessions of the given Weka files/directories; `block_size` (a multiple of the
    files' 64) coarsens the ids, e.g. 576 for vLLM hybrid pages of 9 x 64 tokens."""
    files = expand_paths(paths)
    parts = [load_weka_file(f) for f in files]
    sizes = {p.block_size for p in parts}
    if len(sizes) > 1:
        raise TraceFormatError(f"weka files mix block sizes {sorted(sizes)}: {files}")
    wl = Workload(
        name=name,
        block_size=sizes.pop(),
        sessions=tuple(s for p in parts for s in p.sessions),
        source=f"weka: {len(files)} file(s) from {files[0].parent}",
    ).validate()
    return coarsen(wl, block_size) if block_size else wl
