"""Normalised workload types shared by the loaders, the generators and the simulator.

A `Workload` is a set of `Session`s; a session is an ordered list of `Request`s that one
agent sends, each after the previous response plus a think/tool time (closed loop).

Block ids (`Request.block_hashes`) are *chained* and *global* (see `hashing.py`):
* `block_hashes[i]` identifies the whole prefix of `(i + 1) * block_size` tokens, so equal ids
  at index i imply equal ids at every j < i, and a cache can match a prefix by looking up ids;
* only full blocks have ids: `len(block_hashes) == input_tokens // block_size`;
* ids from different trace files / synthetic sessions never collide, except where the
  source says content is shared (a Weka session and its subagents share one namespace).

Subagents are separate sessions (`kind="subagent"`, `parent` = the spawning session's id)
that start at `parent.start + <spawn offset>`: they run concurrently with their parent and
with each other (Weka shows parent requests sent while a subagent is still running), which
interleaving them into the parent's closed loop would serialise.

Times are seconds. `Session.start` is the offset of the session's first request from the
start of the workload; `Request.t` is the offset from the session start.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Literal

import msgspec
import numpy as np

from .hashing import ID_DTYPE, frozen_ids, mix64_array, namespace_seed

Kind = Literal["main", "subagent"]


class Request(msgspec.Struct, frozen=True, eq=False, kw_only=True):
    """One LLM call.

    Attributes:
        session_id: id of the `Session` holding this request.
        index: position in the session (0-based, send order).
        t: arrival offset from the session start, s (recorded when the source has
            timestamps; see `Workload.arrivals`).
        think_time: s between the end of the previous response of this session and the
            send of this request (tool/user time); closed-loop replay uses this. For the first
            request it is 0 (the session start is the arrival).
        input_tokens: prompt length.
        output_tokens: generated tokens.
        block_hashes: read-only int64 array of chained prefix ids, one per full block.
        kind: "main" or "subagent".
        agent_id: the subagent's id in its source (None for main sessions).
        label: source-specific tag: Weka request type ("n"/"s"), or what a generator did
            to the context ("initial", "append", "mutation", "rewind", "truncate", "compact").
        api_time: observed service time in the source, s, when recorded (Weka), else None.
        message_end: tokens to the end of the prompt's first message (system prompt and
            tool definitions) when the source records it (Weka: system_tokens +
            tool_tokens), else 0. A server finds the same point in the token ids: the
            chat template ends each message with a turn-end token.
        breakpoints: token positions the client declares as ends of cacheable sections,
            as Anthropic's `cache_control` marks them (Weka: where the tool definitions and
            the system prompt end, which every main prompt of the session starts with);
            a server gets them in `kv_transfer_params["histate_breakpoints"]`.
    """

    session_id: str
    index: int
    t: float
    think_time: float
    input_tokens: int
    output_tokens: int
    block_hashes: np.ndarray
    kind: Kind = "main"
    agent_id: str | None = None
    label: str = ""
    api_time: float | None = None
    message_end: int = 0
    breakpoints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Normalise to a read-only int64 array so requests can be shared safely.
        msgspec.structs.force_setattr(self, "block_hashes", frozen_ids(self.block_hashes))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return all(
            getattr(self, f) == getattr(other, f)
            for f in self.__struct_fields__
            if f != "block_hashes"
        ) and np.array_equal(self.block_hashes, other.block_hashes)

    def __repr__(self) -> str:  # the id array would flood logs
        fields = ", ".join(
            f"{f}={getattr(self, f)!r}" for f in self.__struct_fields__ if f != "block_hashes"
        )
        return f"Request({fields}, block_hashes=<{len(self.block_hashes)} ids>)"

    def __hash__(self) -> int:
        tail = int(self.block_hashes[-1]) if len(self.block_hashes) else 0
        return hash((self.session_id, self.index, self.input_tokens, len(self.block_hashes), tail))


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One agent's request stream (a main session or a subagent).

    Attributes:
        id: unique within the workload ("trace_0012", "trace_0276/agent_003", ...).
        start: offset of the first request from the workload start, s.
        requests: the requests in send order; `requests[i].index == i`.
        kind: "main" or "subagent".
        parent: id of the session that spawned this subagent, else None.
        agent_id: the subagent's id in its source, else None.
        source: where it came from (file path, generator), for messages.
    """

    id: str
    start: float
    requests: tuple[Request, ...]
    kind: Kind = "main"
    parent: str | None = None
    agent_id: str | None = None
    source: str = ""

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """A replayable set of sessions with one block size.

    Attributes:
        name: short name for reports.
        block_size: tokens per block id.
        sessions: main sessions and subagent sessions (subagents after their parent).
        source: human-readable description of where it came from.
        arrivals: "recorded" if `Request.t` comes from observed timestamps, "synthetic" if a
            loader/generator derived it from think times (service time taken as 0); closed-loop
            replay (think times) is valid for both.
    """

    name: str
    block_size: int
    sessions: tuple[Session, ...]
    source: str = ""
    arrivals: Literal["recorded", "synthetic"] = "recorded"

    @property
    def n_requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)

    def session(self, session_id: str) -> Session:
        for s in self.sessions:
            if s.id == session_id:
                return s
        raise KeyError(session_id)

    def iter_requests(self) -> Iterator[tuple[float, Session, Request]]:
        """(absolute arrival, session, request) in arrival order (ties: session order)."""

        def stream(i: int, s: Session):  # a function, so each stream binds its own s
            return ((s.start + r.t, i, j, s, r) for j, r in enumerate(s.requests))

        streams = [stream(i, s) for i, s in enumerate(self.sessions)]
        for when, _, _, s, r in heapq.merge(*streams, key=lambda x: x[:3]):
            yield when, s, r

    def validate(self) -> Workload:
        """Check the invariants above; raise ValueError naming the offender. Returns self."""
        if self.block_size <= 0:
            raise ValueError(f"{self.name}: block_size must be positive")
        ids = set()
        for s in self.sessions:
            if s.id in ids:
                raise ValueError(f"{self.name}: duplicate session id {s.id!r} ({s.source})")
            ids.add(s.id)
        for s in self.sessions:
            if s.parent is not None and s.parent not in ids:
                raise ValueError(f"{self.name}: session {s.id!r} has unknown parent {s.parent!r}")
            last_t = -np.inf
            for i, r in enumerate(s.requests):
                where = f"{self.name}: session {s.id!r} request {i}"
                if r.index != i or r.session_id != s.id:
                    raise ValueError(
                        f"{where}: index/session_id mismatch ({r.index}, {r.session_id!r})"
                    )
                if r.t < last_t:
                    raise ValueError(f"{where}: t={r.t} goes back in time")
                last_t = r.t
                if r.input_tokens < 0 or r.output_tokens < 0 or r.think_time < 0:
                    raise ValueError(f"{where}: negative tokens or think_time")
                if len(r.block_hashes) != r.input_tokens // self.block_size:
                    raise ValueError(
                        f"{where}: {len(r.block_hashes)} block ids for {r.input_tokens} tokens "
                        f"(block_size {self.block_size})"
                    )
                if len(r.block_hashes) and int(r.block_hashes.min()) < 0:
                    raise ValueError(f"{where}: negative block id")
        return self


def check_chained(workload: Workload) -> None:
    """Raise ValueError unless ids are prefix-consistent across the whole workload.

    Holds iff every id has one predecessor (the id before it, or "none" at index 0) wherever
    it occurs, i.e. equal ids at index i imply equal ids at every j < i. Vectorised: fine for
    millions of blocks.
    """
    cur, prev = [], []
    for s in workload.sessions:
        last = np.empty(0, dtype=ID_DTYPE)
        for r in s.requests:
            h = r.block_hashes
            # Pairs inside the prefix shared with the previous request repeat its pairs.
            m = min(len(h), len(last))
            diff = np.flatnonzero(h[:m] != last[:m])
            k = int(diff[0]) if len(diff) else m
            if k < len(h):
                cur.append(h[k:])
                prev.append(np.concatenate(([h[k - 1] if k else -1], h[k:-1])))
            last = h
    if not cur:
        return
    c, p = np.concatenate(cur), np.concatenate(prev)
    order = np.lexsort((p, c))
    c, p = c[order], p[order]
    bad = np.flatnonzero((c[1:] == c[:-1]) & (p[1:] != p[:-1]))
    if len(bad):
        i = bad[0]
        raise ValueError(
            f"{workload.name}: block id {c[i]} follows both {p[i]} and {p[i + 1]} (-1: none)"
        )
    # An id must also sit at one index only: a root id (prev -1) reappearing later is caught
    # above, and by induction every other id then has a unique depth.


def coarsen(workload: Workload, block_size: int) -> Workload:
    """Re-express a workload at a larger block size (a multiple of the current one).

    Because ids are chained, the id of a coarse block is the id of its last fine block:
    no re-hashing, and prefix equality is preserved exactly.
    """
    if block_size % workload.block_size:
        raise ValueError(
            f"block_size {block_size} is not a multiple of {workload.name}'s {workload.block_size}"
        )
    f = block_size // workload.block_size
    if f == 1:
        return workload

    def regroup(r: Request) -> Request:
        return msgspec.structs.replace(r, block_hashes=r.block_hashes[f - 1 :: f].copy())

    sessions = tuple(
        msgspec.structs.replace(s, requests=tuple(regroup(r) for r in s.requests))
        for s in workload.sessions
    )
    return msgspec.structs.replace(workload, block_size=block_size, sessions=sessions)


def rekey(sessions: Iterable[Session], salt: object) -> list[Session]:
    """Copies of `sessions` with every id moved to a new namespace named by `salt`.

    Use this to replay the same trace session twice without the copies sharing cache
    entries (e.g. when a replayer samples sessions with replacement). Sessions rekeyed
    together with the same salt keep sharing among themselves (pass a parent together with
    its subagents). Session ids get the suffix "#<salt>".
    """
    seed = namespace_seed("rekey", salt)
    sfx = f"#{salt}"

    def move(r: Request, sid: str) -> Request:
        return msgspec.structs.replace(
            r, session_id=sid, block_hashes=mix64_array(seed, r.block_hashes)
        )

    out = []
    for s in sessions:
        sid = s.id + sfx
        out.append(
            msgspec.structs.replace(
                s,
                id=sid,
                parent=None if s.parent is None else s.parent + sfx,
                requests=tuple(move(r, sid) for r in s.requests),
            )
        )
    return out


__all__ = [
    "ID_DTYPE",
    "Kind",
    "Request",
    "Session",
    "Workload",
    "check_chained",
    "coarsen",
    "rekey",
]
