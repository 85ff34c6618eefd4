"""Seeded synthetic workloads: the paper's mutation microbenchmark and agent context patterns.

Every generator is a pure function of its arguments: the same `seed` gives an identical
`Workload` (same ids), a different seed different ids. Block ids come from `Context`
(see `context.py`): blocks before a cut/edit point keep their ids, everything after gets
fresh ids. Times: turn k of a session is sent `think_time` after turn k-1 (service time
taken as 0 for `t`, so `arrivals == "synthetic"`); sessions start staggered uniformly over
one think gap unless `stagger=False`.

Request labels say what happened to the context before the request:
"initial" (first turn), "append", "mutation" (microbenchmark cut), "rewind" (edit of an
earlier input), "truncate" (middle of a message dropped), "compact" (context summarised).
"""

from __future__ import annotations

import msgspec
import numpy as np

from .context import Context, Namespace
from .model import Request, Session, Workload

MUTATION_RATES = (0.0, 0.02, 0.05, 0.10)


class _Recorder:
    """Accumulates one session's requests with closed-loop times."""

    def __init__(self, sid: str, kind: str = "main", agent_id: str | None = None) -> None:
        self.sid, self.kind, self.agent_id = sid, kind, agent_id
        self.requests: list[Request] = []
        self.t = 0.0

    def emit(self, ctx: Context, output_tokens: int, think_time: float, label: str) -> Request:
        think = think_time if self.requests else 0.0
        self.t += think
        r = Request(
            session_id=self.sid,
            index=len(self.requests),
            t=self.t,
            think_time=think,
            input_tokens=ctx.n_tokens,
            output_tokens=output_tokens,
            block_hashes=ctx.block_hashes(),
            kind=self.kind,
            agent_id=self.agent_id,
            label=label,
        )
        self.requests.append(r)
        return r

    def session(self, start: float, parent: str | None = None, source: str = "") -> Session:
        return Session(
            id=self.sid,
            start=start,
            requests=tuple(self.requests),
            kind=self.kind,
            parent=parent,
            agent_id=self.agent_id,
            source=source,
        )


def _rngs(seed: int, n: int) -> tuple[np.random.Generator, list[np.random.Generator]]:
    """A workload-level generator and one independent generator per session."""
    ss = np.random.SeedSequence(seed)
    top, *per = ss.spawn(n + 1)
    return np.random.default_rng(top), [np.random.default_rng(s) for s in per]


def _starts(rng: np.random.Generator, n: int, spread: float, stagger: bool) -> list[float]:
    return [float(x) for x in rng.uniform(0.0, spread, n)] if stagger and spread > 0 else [0.0] * n


def mutation_benchmark(
    p: float = 0.0,
    *,
    n_sessions: int = 24,
    turns: int = 16,
    new_tokens: int = 8192,
    output_tokens: int = 256,
    think_time: float = 180.0,
    cut_granularity: int = 256,
    shared_prefix_tokens: int = 0,
    block_size: int = 64,
    stagger: bool = True,
    seed: int = 0,
) -> Workload:
    """The paper's §4.3 microbenchmark.

    Each session sends `turns` requests; each adds `new_tokens` new input tokens and gets
    `output_tokens` back. Normally a turn extends the whole history (previous prompt and
    output). With probability `p` a later turn is a *mutation*: it cuts the previous prompt at
    a uniformly chosen internal multiple of `cut_granularity` tokens and appends its new
    input there, without restoring the discarded suffix. `shared_prefix_tokens` > 0 gives all
    sessions a common system prompt (the paper does not state one).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"mutation probability must be in [0, 1], got {p}")
    name = f"mutation-p{p:g}"
    top, rngs = _rngs(seed, n_sessions)
    starts = _starts(top, n_sessions, think_time, stagger)
    system = Context(Namespace("synth", name, seed, "system"), block_size)
    system.append(shared_prefix_tokens)
    sessions = []
    for i, rng in enumerate(rngs):
        sid = f"{name}/{i:03d}"
        ctx = system.fork(Namespace("synth", name, seed, sid))
        rec = _Recorder(sid)
        prompt_len = 0
        for k in range(turns):
            label = "initial" if k == 0 else "append"
            n_cuts = (prompt_len - 1) // cut_granularity  # boundaries strictly inside the prompt
            if k > 0 and n_cuts > 0 and rng.random() < p:
                ctx.keep(int(rng.integers(1, n_cuts + 1)) * cut_granularity)
                label = "mutation"
            ctx.append(new_tokens)
            prompt_len = ctx.n_tokens
            rec.emit(ctx, output_tokens, think_time, label)
            ctx.append(output_tokens)
        sessions.append(rec.session(starts[i], source=f"synth.mutation_benchmark(seed={seed})"))
    return Workload(
        name=name,
        block_size=block_size,
        sessions=tuple(sessions),
        source=f"synthetic mutation microbenchmark p={p} seed={seed}",
        arrivals="synthetic",
    ).validate()


class Shape(msgspec.Struct, frozen=True, kw_only=True):
    """Size and timing knobs common to the agent-pattern generators.

    Attributes:
        n_sessions: main sessions.
        turns: requests per main session.
        system_tokens: system prompt shared by all main sessions of the workload.
        new_tokens: mean new input tokens per turn (tool results, user messages).
        output_tokens: tokens generated per turn.
        think_time: s between a response and the next request of the session.
        jitter: new_tokens is drawn uniformly from mean * [1 - jitter, 1 + jitter].
        block_size: tokens per block id.
        stagger: spread session starts uniformly over one think_time.
        seed: everything random derives from it.
    """

    n_sessions: int = 8
    turns: int = 16
    system_tokens: int = 4096
    new_tokens: int = 2048
    output_tokens: int = 256
    think_time: float = 30.0
    jitter: float = 0.5
    block_size: int = 64
    stagger: bool = True
    seed: int = 0


DEFAULT_SHAPE = Shape()


def _draw(rng: np.random.Generator, mean: int, jitter: float) -> int:
    return max(1, int(round(mean * rng.uniform(1.0 - jitter, 1.0 + jitter))))


class _Forks(msgspec.Struct, frozen=True):
    every: int
    count: int
    turns: int
    system_tokens: int
    new_tokens: int
    think_time: float
    inherit: bool


def _agent_workload(
    name: str,
    shape: Shape,
    *,
    p_rewind: float = 0.0,
    p_truncate: float = 0.0,
    keep_head: float = 0.25,
    keep_tail: float = 0.25,
    marker_tokens: int = 16,
    compact_at: int | None = None,
    summary_tokens: int = 1024,
    forks: _Forks | None = None,
) -> Workload:
    """Engine behind the pattern generators; each turn picks at most one context operation."""
    if p_rewind < 0 or p_truncate < 0 or p_rewind + p_truncate > 1:
        raise ValueError("p_rewind and p_truncate must be >= 0 with sum <= 1")
    if not (0 < keep_head and 0 < keep_tail and keep_head + keep_tail < 1):
        raise ValueError("keep_head and keep_tail must be positive with sum < 1")
    if compact_at is not None and summary_tokens + shape.system_tokens >= compact_at:
        raise ValueError("compact_at must exceed system_tokens + summary_tokens")
    if forks is not None and (forks.every < 1 or forks.count < 0 or forks.turns < 1):
        raise ValueError("forks need every >= 1, count >= 0 and turns >= 1")
    seed, bs = shape.seed, shape.block_size
    top, rngs = _rngs(seed, shape.n_sessions)
    starts = _starts(top, shape.n_sessions, shape.think_time, shape.stagger)
    system = Context(Namespace("synth", name, seed, "system"), bs)
    system.append(shape.system_tokens)
    sub_system = Context(Namespace("synth", name, seed, "subagent-system"), bs)
    if forks is not None:
        sub_system.append(forks.system_tokens)
    src = f"synth.{name}(seed={seed})"
    sessions: list[Session] = []
    for i, rng in enumerate(rngs):
        sid = f"{name}/{i:03d}"
        ctx = system.fork(Namespace("synth", name, seed, sid))
        rec = _Recorder(sid)
        spans: list[tuple[int, int]] = []  # token span of each turn's new input in ctx
        subagents: list[Session] = []
        for k in range(shape.turns):
            label = "initial" if k == 0 else "append"
            n_new = _draw(rng, shape.new_tokens, shape.jitter)
            u = rng.random()
            long_spans = [j for j, (a, b) in enumerate(spans) if b - a >= 4]
            if k and compact_at is not None and ctx.n_tokens + n_new > compact_at:
                # Compaction: everything after the system prompt becomes a short summary.
                ctx.keep(min(shape.system_tokens, ctx.n_tokens))
                ctx.append(summary_tokens)
                spans, label = [], "compact"
            elif k and spans and u < p_rewind:
                # Rewind to an earlier input, edit it from a random token on.
                j = int(rng.integers(len(spans)))
                a, b = spans[j]
                cut = int(rng.integers(a, b))
                ctx.keep(cut)
                ctx.append(b - cut)
                spans, label = spans[: j + 1], "rewind"
            elif k and long_spans and u < p_rewind + p_truncate:
                # Truncate a message: keep its head and tail around an omission marker.
                j = long_spans[int(rng.integers(len(long_spans)))]
                a, b = spans[j]
                head = a + max(1, int((b - a) * keep_head))
                tail = max(1, int((b - a) * keep_tail))
                rest = ctx.n_tokens - b
                ctx.keep(head)
                ctx.append(marker_tokens + tail + rest)
                shift = head + marker_tokens + tail - b
                spans = (
                    spans[:j]
                    + [(a, b + shift)]
                    + [(x + shift, y + shift) for x, y in spans[j + 1 :]]
                )
                label = "truncate"
            start = ctx.n_tokens
            ctx.append(n_new)
            spans.append((start, ctx.n_tokens))
            req = rec.emit(ctx, shape.output_tokens, shape.think_time, label)
            ctx.append(shape.output_tokens)
            if forks is not None and k % forks.every == forks.every - 1:
                for _ in range(forks.count):
                    agent = f"agent_{len(subagents) + 1:03d}"
                    sub = _Recorder(f"{sid}/{agent}", kind="subagent", agent_id=agent)
                    base = ctx if forks.inherit else sub_system
                    sctx = base.fork(Namespace("synth", name, seed, sub.sid))
                    for t in range(forks.turns):
                        sctx.append(_draw(rng, forks.new_tokens, shape.jitter))
                        sub.emit(
                            sctx,
                            shape.output_tokens,
                            forks.think_time,
                            "append" if t else "initial",
                        )
                        sctx.append(shape.output_tokens)
                    subagents.append(sub.session(starts[i] + req.t, parent=sid, source=src))
        sessions.append(rec.session(starts[i], source=src))
        sessions.extend(subagents)
    return Workload(
        name=name,
        block_size=bs,
        sessions=tuple(sessions),
        arrivals="synthetic",
        source=f"synthetic agent pattern {name} {shape}",
    ).validate()


def append_pattern(shape: Shape = DEFAULT_SHAPE) -> Workload:
    """Plain multi-turn agent: every turn extends the whole previous context."""
    return _agent_workload("append", shape)


def rewind_edit_pattern(shape: Shape = DEFAULT_SHAPE, *, p: float = 0.2) -> Workload:
    """With probability p a turn rewinds to an earlier input and revises it from a random
    token on; the reusable prefix ends where the edit begins (paper Fig. 2b)."""
    return _agent_workload("rewind-edit", shape, p_rewind=p)


def truncation_pattern(
    shape: Shape = DEFAULT_SHAPE,
    *,
    p: float = 0.2,
    keep_head: float = 0.25,
    keep_tail: float = 0.25,
    marker_tokens: int = 16,
) -> Workload:
    """With probability p a turn truncates an earlier message: keeps its first `keep_head`
    and last `keep_tail` fractions around a `marker_tokens` omission marker. Ids stay equal
    up to the head; the tail and everything after get new ids (paper Fig. 2a)."""
    return _agent_workload(
        "truncation",
        shape,
        p_truncate=p,
        keep_head=keep_head,
        keep_tail=keep_tail,
        marker_tokens=marker_tokens,
    )


def compaction_pattern(
    shape: Shape = DEFAULT_SHAPE,
    *,
    compact_at: int = 32768,
    summary_tokens: int = 1024,
) -> Workload:
    """When a turn would push the context past `compact_at` tokens, the history after the
    system prompt is replaced by a `summary_tokens` summary (new ids) first."""
    return _agent_workload(
        "compaction", shape, compact_at=compact_at, summary_tokens=summary_tokens
    )


def subagent_fork_pattern(
    shape: Shape = DEFAULT_SHAPE,
    *,
    every: int = 4,
    forks: int = 3,
    sub_turns: int = 4,
    sub_system_tokens: int = 2048,
    sub_new_tokens: int = 1024,
    sub_think_time: float = 2.0,
    inherit_parent_context: bool = False,
) -> Workload:
    """Every `every`-th turn a main session spawns `forks` concurrent subagent sessions that
    start at that request's arrival. Subagents share one subagent system prompt (as Weka's
    Explore agents do), or with `inherit_parent_context` start from the parent's context."""
    cfg = _Forks(
        every=every,
        count=forks,
        turns=sub_turns,
        system_tokens=sub_system_tokens,
        new_tokens=sub_new_tokens,
        think_time=sub_think_time,
        inherit=inherit_parent_context,
    )
    return _agent_workload("subagent-fork", shape, forks=cfg)


def mixed_agent_pattern(
    shape: Shape = DEFAULT_SHAPE,
    *,
    p_rewind: float = 0.05,
    p_truncate: float = 0.05,
    compact_at: int | None = 65536,
    every: int = 8,
    forks: int = 2,
) -> Workload:
    """All patterns at once, for end-to-end runs."""
    cfg = (
        _Forks(
            every=every,
            count=forks,
            turns=4,
            system_tokens=2048,
            new_tokens=1024,
            think_time=2.0,
            inherit=False,
        )
        if forks
        else None
    )
    return _agent_workload(
        "mixed", shape, p_rewind=p_rewind, p_truncate=p_truncate, compact_at=compact_at, forks=cfg
    )
