"""Loaders for TraceLab (uw-syfi/TraceLab) round traces and replayer CSVs.

TraceLab has token counts but no block hashes. We synthesise chained ids with a per-session
`Context` (see `context.py`): the context after a round is its prompt followed by its
output; the next round keeps the first `prefix` tokens of that context (its blocks keep
their ids) and appends the rest of its prompt as new tokens (fresh ids). So the first
`prefix // block_size` blocks of round i equal round i-1's context blocks, the rest are new.
A prefix shorter than the previous prompt is thus a rewind/truncation (an internal hit).

Caveats of the source numbers (they are what the paper replays, so we keep them):
* round JSONL `prefix_tokens` is the *provider's* cache hit (Claude `cache_read`, Codex
  `cached_input_tokens`, 128-token granular), a lower bound on the true shared prefix: Claude
  rows stop at the previous prompt (the previous output is never counted), and a provider
  miss shows up as a deep rewind (e.g. Codex round 3: 3456 of 10058 tokens).
* A first round's prefix (a provider cache hit from before the trace) has nothing to reuse
  here: it becomes new tokens in the session's own namespace. Likewise a later prefix longer
  than the previous context is clamped to it.

Timing. JSONL: a round is sent at the last input event (`user_message`/`tool_result`) before
its first output event and ends at its last event; `think_time` = send - previous end,
`t` = send - session send of round 0, session start = offset from the earliest session in
the file(s). A round without timestamps falls back to the previous round's slowest tool.
CSV (closed-loop replayer format, `arrival_time` in ms per session, optional):
`think_time` = previous row's `tool_wait_after_ms`; `t` is the cumulative think time
(service time unknown), so the workload's `arrivals` is "synthetic".
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import msgspec

from ..context import Context, Namespace
from ..model import Request, Session, Workload
from .common import Paths, TraceFormatError, expand_paths, iter_jsonl

DEFAULT_BLOCK_SIZE = 64
_INPUT_EVENTS = frozenset({"user_message", "tool_result"})

_NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class _Event(msgspec.Struct):
    event_type: str
    timestamp: datetime | None = None


class _Tool(msgspec.Struct):
    tool_wall_latency_ms: float | None = None


class _Round(msgspec.Struct):
    session_id: str
    round_index: _NonNeg
    input_tokens_total: _NonNeg
    prefix_tokens: _NonNeg | None = None
    newly_append_tokens: _NonNeg | None = None
    output_tokens: _NonNeg | None = None
    provider: str = ""
    timing_events: list[_Event] = []
    tools: list[_Tool] = []


def _round_times(r: _Round) -> tuple[datetime | None, datetime | None]:
    """(send, end) of a round from its events; None when it has no timestamps."""
    # Naive timestamps are taken as UTC so they compare with "...Z" ones.
    stamped = [
        (
            e.event_type,
            e.timestamp if e.timestamp.tzinfo else e.timestamp.replace(tzinfo=timezone.utc),
        )
        for e in r.timing_events
        if e.timestamp is not None
    ]
    if not stamped:
        return None, None
    send = stamped[0][1]
    for kind, when in stamped:
        if kind not in _INPUT_EVENTS:
            break
        send = max(send, when)
    return send, max(when for _, when in stamped)


def _session_requests(
    sid: str,
    ctx: Context,
    rows: list[tuple[int, int, int, int]],
    thinks: list[float],
    ts: list[float],
) -> tuple[Request, ...]:
    """Requests from (prefix, prompt, output, line) rows; see the module doc for the rule."""
    out = []
    for i, (prefix, prompt, output, _line) in enumerate(rows):
        kept = min(prefix, ctx.n_tokens)
        ctx.keep(kept)
        ctx.append(prompt - kept)
        out.append(
            Request(
                session_id=sid,
                index=i,
                t=ts[i],
                think_time=thinks[i],
                input_tokens=prompt,
                output_tokens=output,
                block_hashes=ctx.block_hashes(),
            )
        )
        ctx.append(output)
    return tuple(out)


def load_tracelab_rounds(
    paths: Paths,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    providers: Iterable[str] | None = None,
    name: str = "tracelab",
) -> Workload:
    """Sessions from TraceLab `*round_trace.jsonl` files (one LLM round per line).

    `providers` keeps only those providers ("codex", "claude"); the paper uses Codex only.
    """
    keep = None if providers is None else set(providers)
    files = expand_paths(paths)
    decoder = msgspec.json.Decoder(_Round)
    groups: dict[tuple[Path, str], dict[int, tuple[int, _Round]]] = {}
    for path in files:
        for line, r in iter_jsonl(path, decoder):
            if keep is not None and r.provider not in keep:
                continue
            where = f"{path}:{line}"
            prefix = r.prefix_tokens or 0
            if prefix > r.input_tokens_total:
                raise TraceFormatError(
                    f"{where}: prefix_tokens {prefix} > input_tokens_total {r.input_tokens_total}"
                )
            if (
                r.newly_append_tokens is not None
                and prefix + r.newly_append_tokens != r.input_tokens_total
            ):
                raise TraceFormatError(
                    f"{where}: prefix_tokens + newly_append_tokens != input_tokens_total "
                    f"({prefix} + {r.newly_append_tokens} != {r.input_tokens_total})"
                )
            rounds = groups.setdefault((path, r.session_id), {})
            if r.round_index in rounds:
                raise TraceFormatError(
                    f"{where}: duplicate round_index {r.round_index} for session {r.session_id!r} "
                    f"(first at line {rounds[r.round_index][0]})"
                )
            rounds[r.round_index] = (line, r)

    staged = []
    for (path, sid), rounds in groups.items():
        ordered = [rounds[k] for k in sorted(rounds)]
        thinks: list[float] = []
        ts: list[float] = []
        first_send = prev_end = None
        for i, (_line, r) in enumerate(ordered):
            send, end = _round_times(r)
            if i == 0:
                think, t, first_send = 0.0, 0.0, send
            elif send is not None and prev_end is not None and first_send is not None:
                think = max(0.0, (send - prev_end).total_seconds())
                t = (send - first_send).total_seconds()
            else:  # no timestamps: wait for the previous round's slowest tool
                tools = ordered[i - 1][1].tools
                think = max((x.tool_wall_latency_ms or 0.0 for x in tools), default=0.0) / 1000
                t = ts[-1] + think
            thinks.append(think)
            ts.append(max(t, ts[-1]) if ts else t)
            prev_end = end
        rows = [
            (r.prefix_tokens or 0, r.input_tokens_total, r.output_tokens or 0, line)
            for line, r in ordered
        ]
        staged.append((path, sid, first_send, rows, thinks, ts))

    origin = min((s[2] for s in staged if s[2] is not None), default=None)
    sessions = []
    for path, sid, first_send, rows, thinks, ts in staged:
        full = f"{path.stem}/{sid}"
        ctx = Context(Namespace("tracelab", path.stem, sid), block_size)
        start = (first_send - origin).total_seconds() if first_send is not None else 0.0
        sessions.append(
            Session(
                id=full,
                start=start,
                source=str(path),
                requests=_session_requests(full, ctx, rows, thinks, ts),
            )
        )
    return Workload(
        name=name,
        block_size=block_size,
        sessions=tuple(sessions),
        source=f"tracelab rounds: {', '.join(map(str, files))}",
    ).validate()


_CSV_REQUIRED = ("round_idx", "prefix_len", "input_len", "output_len", "tool_wait_after_ms")


def _csv_number(path: Path, line: int, row: dict, field: str, kind: type):
    raw = row.get(field)
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise TraceFormatError(
            f"{path}:{line}: field {field!r}: expected {kind.__name__}, got {raw!r}"
        ) from None
    if value < 0:
        raise TraceFormatError(f"{path}:{line}: field {field!r}: negative value {raw!r}")
    return value


def load_tracelab_csv(
    paths: Paths, *, block_size: int = DEFAULT_BLOCK_SIZE, name: str = "tracelab-csv"
) -> Workload:
    """Sessions from TraceLab replayer CSVs:
    `session_id|id,[arrival_time,]round_idx,prefix_len,input_len,output_len,tool_wait_after_ms`.
    A round's prompt is `prefix_len + input_len` tokens."""
    files = expand_paths(paths)
    sessions = []
    for path in files:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            id_col = "session_id" if "session_id" in header else "id" if "id" in header else None
            missing = [c for c in _CSV_REQUIRED if c not in header] + (
                [] if id_col else ["session_id"]
            )
            if missing:
                raise TraceFormatError(f"{path}:1: missing column(s) {missing} in header {header}")
            groups: dict[str, dict[int, tuple]] = {}
            for row in reader:
                line = reader.line_num
                if None in row or any(v is None for v in row.values()):
                    raise TraceFormatError(f"{path}:{line}: expected {len(header)} fields")
                rnd = _csv_number(path, line, row, "round_idx", int)
                arrival = (
                    _csv_number(path, line, row, "arrival_time", float)
                    if "arrival_time" in header
                    else 0.0
                )
                rec = (
                    _csv_number(path, line, row, "prefix_len", int),
                    _csv_number(path, line, row, "input_len", int),
                    _csv_number(path, line, row, "output_len", int),
                    _csv_number(path, line, row, "tool_wait_after_ms", float),
                    arrival,
                    line,
                )
                rounds = groups.setdefault(row[id_col], {})
                if rnd in rounds:
                    raise TraceFormatError(
                        f"{path}:{line}: duplicate round_idx {rnd} for session {row[id_col]!r}"
                    )
                rounds[rnd] = rec
        for sid, rounds in groups.items():
            ordered = [rounds[k] for k in sorted(rounds)]
            thinks = [0.0] + [r[3] / 1000 for r in ordered[:-1]]
            ts, acc = [], 0.0
            for th in thinks:
                acc += th
                ts.append(acc)
            ts[0] = 0.0
            full = f"{path.stem}/{sid}"
            ctx = Context(Namespace("tracelab-csv", path.stem, sid), block_size)
            rows = [(p, p + n, o, line) for p, n, o, _w, _a, line in ordered]
            sessions.append(
                Session(
                    id=full,
                    start=ordered[0][4] / 1000,
                    source=str(path),
                    requests=_session_requests(full, ctx, rows, thinks, ts),
                )
            )
    return Workload(
        name=name,
        block_size=block_size,
        sessions=tuple(sessions),
        source=f"tracelab csv: {', '.join(map(str, files))}",
        arrivals="synthetic",
    ).validate()
