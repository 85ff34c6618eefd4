"""Loader for Mooncake (FAST'25) request traces: `timestamp` (ms), `input_length`,
`output_length`, `hash_ids` (512-token blocks, `len == ceil(input_length / 512)`).

Ids are re-chained in one namespace per file ("mooncake:<file stem>"; the file's ids are
shared across its requests, e.g. block 0 is a common system prompt). The id of a trailing
partial block is dropped (it names content that changes once the block fills up, and vLLM
caches full blocks only), so `len(block_hashes) == input_length // 512`.

Sessions are not in the data; they are inferred from prefix chains, in file order:
    a request R joins the session of an earlier request Q whose full-block ids are a
    prefix of R's ids and number at least `min_match_blocks`, choosing the longest such
    Q (the latest one among equals); if there is none, R starts a new session.
The minimum (default 2) stops a lone shared system-prompt block from merging unrelated
conversations (every request of `conversation_trace.jsonl` starts with block 0).
Matching only whole previous prompts (not partial overlaps) means a conversation that edits
or truncates its history starts a new session; that is the conservative reading.

Timing: `t` is the recorded arrival offset; the trace has no response times, so `think_time`
is the whole inter-arrival gap (an upper bound). Prefer open-loop replay on `t`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from ..hashing import Chainer, namespace_seed
from ..model import Request, Session, Workload, coarsen
from .common import Paths, TraceFormatError, expand_paths, iter_jsonl

NATIVE_BLOCK_SIZE = 512

_NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class _Row(msgspec.Struct):
    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: _NonNeg
    output_length: _NonNeg
    hash_ids: list[_NonNeg]


def _file_sessions(path: Path, min_match_blocks: int) -> list[Session]:
    bs = NATIVE_BLOCK_SIZE
    chainer = Chainer(namespace_seed("mooncake", path.stem))
    # Per inferred session: list of (arrival s, row); index from a full prompt's last id.
    members: list[list[tuple[float, _Row, object]]] = []
    by_last_id: dict[int, int] = {}
    last_ts = 0.0
    for line, r in iter_jsonl(path, msgspec.json.Decoder(_Row)):
        full = r.input_length // bs
        if len(r.hash_ids) not in (full, -(-r.input_length // bs)):
            raise TraceFormatError(
                f"{path}:{line}: {len(r.hash_ids)} hash_ids for input_length {r.input_length} "
                f"(block size {bs})"
            )
        if r.timestamp < last_ts:
            raise TraceFormatError(f"{path}:{line}: timestamp {r.timestamp} goes back in time")
        last_ts = r.timestamp
        ids = chainer.chain(r.hash_ids[:full])
        owner = None
        for k in range(len(ids), min_match_blocks - 1, -1):
            owner = by_last_id.get(int(ids[k - 1]))
            if owner is not None:
                break
        if owner is None:
            owner = len(members)
            members.append([])
        members[owner].append((r.timestamp / 1000, r, ids))
        if full >= min_match_blocks:
            by_last_id[int(ids[-1])] = owner
    sessions = []
    for n, reqs in enumerate(members):
        sid = f"{path.stem}/{n}"
        start = reqs[0][0]
        requests = tuple(
            Request(
                session_id=sid,
                index=i,
                t=at - start,
                think_time=(at - reqs[i - 1][0]) if i else 0.0,
                input_tokens=r.input_length,
                output_tokens=r.output_length,
                block_hashes=ids,
            )
            for i, (at, r, ids) in enumerate(reqs)
        )
        sessions.append(Session(id=sid, start=start, requests=requests, source=str(path)))
    return sessions


def load_mooncake(
    paths: Paths,
    *,
    min_match_blocks: int = 2,
    block_size: int | None = None,
    name: str = "mooncake",
) -> Workload:
    """Inferred sessions of Mooncake JSONL traces; `block_size` (a multiple of 512) coarsens."""
    if min_match_blocks < 1:
        raise ValueError("min_match_blocks must be >= 1")
    files = expand_paths(paths)
    sessions = [s for f in files for s in _file_sessions(f, min_match_blocks)]
    wl = Workload(
        name=name,
        block_size=NATIVE_BLOCK_SIZE,
        sessions=tuple(sessions),
        source=f"mooncake: {', '.join(map(str, files))}",
    ).validate()
    return coarsen(wl, block_size) if block_size else wl
