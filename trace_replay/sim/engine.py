"""Discrete-event replay of a workload against one simulated caching system.

Closed loop, as in the HiState paper §4.1: at most `concurrency` main sessions are live; the
first ones start at their recorded offsets (plus an optional ramp), and whenever a main
session's last request finishes, the next one (seeded random order) starts. A subagent starts
when its parent sends the request it was spawned after (plus the recorded offset, capped and
scaled like a gap). Within a session, request k+1 is sent a gap after request k's last output
token, as kv-cache-tester's `trace_replay_tester.py` (the replayer that publishes the Weka
traces) does: gap = min(raw, max_delay) * time_scale, where raw is the recorded arrival gap
t[k+1] - t[k] (`gap="arrival"`, its `original` timing) or the request's `think_time`
(`gap="think"`, its `think-only` timing; Weka's think_time counts from the last request that
has an api_time, so it overstates gaps). A context limit ends a session at its first request
longer than it (kv-cache-tester's --max-context: the user is "truncated"); the subagents it
would have spawned from then on are not replayed either (`limit_context`).

Each request: arrival -> restore (SSD reads first, on one drive, FIFO, sharing it with the
SSD writes: drive.py; then every restored byte over one host-to-device link, FIFO, which an
SSD read does not hold, as HiState's worker reads on its own threads: alone, a restore takes
the read plus the copy, paper eq. 2)
-> prefill (one compute queue, FIFO, i.e. vLLM's FCFS scheduler with the GPU saturated by
one prefill at a time; or, with `concurrent_prefills` k > 1, up to k prefills sharing the
GPU as vLLM's long_prefill_token_threshold lets them: compute.py) -> first token (TTFT =
now - arrival, queueing included) -> decode (output_tokens steps; decode does not hold the
prefill queue).

Stores: vLLM hands the offloading connector each step's computed blocks when the step ends,
so a policy is given the blocks up to each prefill chunk end (`SimPolicy.store_step`) at the
time the prefill passes it (its share of the prefill's FLOPs), and the rest at the first
token (`prefilled`). What it copies to SSD then goes through the drive's write queue.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from histate_vllm.policy.chunk_grid import extra_steps

from ..costmodel import CostModel
from msgspec.structs import replace as replace_struct

from ..model import Session, Workload
from .compute import SharedPrefill
from .drive import Drive
from .job import Job

if TYPE_CHECKING:
    from ..policies.base import SimPolicy

_ARRIVE, _LOADED, _PREFILLED, _FINISHED, _WAKE, _COPY, _STEP, _DRIVE, _FLEET = range(9)


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """How a workload is replayed. None fields take the workload's default (`resolved`)."""

    concurrency: int = 24
    seed: int = 0
    ramp: float = 0.0  # initial sessions are admitted spread over this many seconds
    # "arrival" (recorded t[k+1] - t[k]) or "think" (think_time). None: "arrival" for
    # recorded traces, "think" for synthetic workloads (whose t is derived from think times).
    gap: str | None = None
    # Cap on one gap, s (inf: none). None: kv-cache-tester's default 60 s for recorded
    # traces; none for synthetic workloads (their gaps are the experiment, e.g. 3 minutes).
    max_delay: float | None = None
    time_scale: float = 1.0  # multiplies every (capped) gap, as kv-cache-tester's --time-scale
    # Sessions end at their first request with more input tokens (0: no limit). None: the
    # model's context length (set by `simulate.prepare`).
    max_context: int | None = None
    think_scale: float = 1.0  # "think" gaps only (older option; time_scale applies on top)
    max_think: float | None = None  # "think" gaps only: cap on one think/tool gap, s
    # Prefills that advance together (compute.py): 1 = vLLM's default FCFS, k = vLLM with
    # long_prefill_token_threshold = max_num_batched_tokens / k.
    concurrent_prefills: int = 1

    def resolved(self, workload: Workload) -> ReplaySettings:
        recorded = workload.arrivals == "recorded"
        gap = self.gap or ("arrival" if recorded else "think")
        if gap not in ("arrival", "think"):
            raise ValueError(f"gap must be 'arrival' or 'think', got {gap!r}")
        max_delay = self.max_delay
        if max_delay is None:
            max_delay = DEFAULT_MAX_DELAY if recorded else math.inf
        if max_delay <= 0 or self.time_scale < 0:
            raise ValueError("max_delay must be > 0 (inf: no cap) and time_scale >= 0")
        if self.concurrent_prefills < 1:
            raise ValueError(f"concurrent_prefills must be >= 1, got {self.concurrent_prefills}")
        return replace(self, gap=gap, max_delay=max_delay)


DEFAULT_MAX_DELAY = 60.0  # s, kv-cache-tester's --max-delay default


def limit_context(workload: Workload, max_context: int) -> tuple[Workload, int]:
    """End each session at its first request longer than `max_context` tokens (0: no limit);
    drop the subagents spawned from then on (and empty sessions). Returns the workload and
    the number of requests left out."""
    if max_context <= 0:
        return workload, 0
    by_id = {s.id: s for s in workload.sessions}
    kept: dict[str, Session] = {}
    for s in workload.sessions:  # parents come before their subagents
        if s.parent is not None:
            parent = kept.get(s.parent)
            if parent is None:
                continue
            full = by_id[s.parent].requests
            n = len(parent.requests)
            if n < len(full) and s.start - by_id[s.parent].start >= full[n].t:
                continue  # spawned from a request past the parent's end (see Replay.spawn)
        n = len(s.requests)
        for k, r in enumerate(s.requests):
            if r.input_tokens > max_context:
                n = k
                break
        if n == 0:
            continue
        kept[s.id] = s if n == len(s.requests) else replace_struct(s, requests=s.requests[:n])
    sessions = tuple(kept.values())
    dropped = workload.n_requests - sum(len(s.requests) for s in sessions)
    if not dropped:
        return workload, 0
    return replace_struct(workload, sessions=sessions), dropped


class SimClock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class RunResult:
    """Per-request outcome arrays, indexed like `Replay.requests` (workload order)."""

    policy: str
    ttft: np.ndarray
    hit: np.ndarray  # tokens reused (resume point)
    gpu_hit: np.ndarray
    shared: np.ndarray  # longest prefix whose KV the policy held, with a state or not
    dram_bytes: np.ndarray
    ssd_bytes: np.ndarray
    arrival: np.ndarray
    makespan: float
    wall_s: float
    stats: dict = field(default_factory=dict)
    engine: np.ndarray | None = None  # the engine that served each request (a fleet)
    fleet_bytes: np.ndarray | None = None  # bytes each restore read from a fleet tier


class Replay:
    """The workload's static structure: request ids, session order, subagent spawn points."""

    def __init__(self, workload: Workload, settings: ReplaySettings):
        self.workload = workload
        self.settings = settings = settings.resolved(workload)
        self.sessions = workload.sessions
        self.offset: list[int] = []
        self.requests = []
        for s in self.sessions:
            self.offset.append(len(self.requests))
            self.requests.extend(s.requests)
        self.blocks = [r.block_hashes.tolist() for r in self.requests]
        index = {s.id: i for i, s in enumerate(self.sessions)}
        # spawn[(parent session, request index)] = [(delay, child session)]
        self.spawn: dict[tuple[int, int], list[tuple[float, int]]] = {}
        mains = []
        for i, s in enumerate(self.sessions):
            if not s.requests:
                continue
            if s.kind == "main" or s.parent is None:
                mains.append(i)
                continue
            pi = index[s.parent]
            parent = self.sessions[pi]
            at = s.start - parent.start
            j = 0
            for k, r in enumerate(parent.requests):
                if r.t <= at:
                    j = k
            delay = max(0.0, at - parent.requests[j].t) if parent.requests else 0.0
            self.spawn.setdefault((pi, j), []).append((delay, i))
        rng = np.random.default_rng(settings.seed)
        self.order = [mains[i] for i in rng.permutation(len(mains))]


def drive_stats(drive: Drive) -> dict:
    st = drive.stats
    return {"ssd_read_gb": round(st["read_bytes"] / 1e9, 2),
            "ssd_written_gb": round(st["written_bytes"] / 1e9, 2),
            "ssd_writes_dropped": st["writes_dropped"],
            "ssd_write_gb_dropped": round(st["write_bytes_dropped"] / 1e9, 2),
            "ssd_read_busy_s": round(st["read_busy_s"], 3),
            "ssd_write_busy_s": round(st["write_busy_s"], 3)}


@dataclass(eq=False)
class Engine:
    """One serving engine: its caching system (policy), SSD, host-to-device link and GPU
    prefill queue; in a fleet with a fleet tier, also its own link to that tier (a `Drive`:
    restores and publishes share it, each paying `fleet_latency` s once per restore)."""

    policy: SimPolicy
    drive: Drive
    fleet_link: Drive | None = None
    fleet_latency: float = 0.0
    link_free: float = 0.0
    gpu_free: float = 0.0
    shared: SharedPrefill | None = None
    outstanding: int = 0  # prompt tokens of requests routed here, first token not yet out
    in_flight: int = 0  # requests routed here and not finished
    served: int = 0


def _only_engine(job: Job, session: int, engines: list[Engine]) -> int:
    return 0


def _merged_stats(engines: list[Engine], extra_steps: int) -> dict:
    """One engine: its policy's and drive's stats. Several: their integer counts summed,
    and each engine's own under "engines"."""
    per = [{**e.policy.stats(), **drive_stats(e.drive), "requests": e.served}
           for e in engines]
    if len(per) == 1:
        out = dict(per[0])
        del out["requests"]
    else:
        out = {}
        for d in per:
            for k, v in d.items():
                if isinstance(v, int) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        out["engines"] = per
    out["chunk_ends_added"] = extra_steps
    return out


class Simulator:
    def __init__(self, replay: Replay, cost: CostModel, policy: SimPolicy | None,
                 clock: SimClock, drive: Drive | None = None, chunk_tokens: int | None = None,
                 charge_chunk_ends: bool = False, *, engines: list[Engine] | None = None,
                 route: Callable[[Job, int, list[Engine]], int] | None = None):
        """drive: the SSD shared with the policy (its `ctx.drive`); None: a drive of the
        device's bandwidth whose writes are free. chunk_tokens: prefill chunk (a vLLM step),
        default the device's. charge_chunk_ends: each prefill chunk end a request's
        checkpoints add beyond vLLM's split costs one more step (tpot).
        engines (instead of policy and drive): a fleet, one clock for all; route(job,
        session, engines) picks each request's engine on arrival (sim/fleet.py)."""
        self.r = replay
        self.cost = cost
        self.clock = clock
        if engines is None:
            bw = cost.device.ssd_bw
            drive = drive or Drive(bw, bw, queue_bytes=None, charge_writes=False)
            engines = [Engine(policy, drive)]
        self.engines = engines
        self.route = route or _only_engine
        self.policy, self.drive = engines[0].policy, engines[0].drive
        self.chunk_tokens = chunk_tokens or cost.device.chunk_tokens
        self.charge_chunk_ends = charge_chunk_ends
        self.extra_steps = 0
        for e in engines:
            bind = getattr(e.policy, "bind_replay", None)  # references that know the future
            if bind is not None:
                bind(replay)

    def forced_steps(self, job: Job) -> int:
        """Steps the request's checkpoints add to vLLM's split of its prefill: each one
        ends a chunk (vLLM saves states only there) and restarts the chunk grid."""
        B = job.block_tokens
        chunk = max(B, self.chunk_tokens // B * B)
        start, end = job.resume // B * B, job.prompt_end
        if end <= start:
            return 0
        return extra_steps([c for c in job.captures if start < c < end], start, end, chunk)

    def step_ends(self, job: Job) -> list[int]:
        """Blocks computed by the end of each prefill chunk but the last (vLLM's steps
        from the resume point; the last one is the first token)."""
        B, chunk = job.block_tokens, self.chunk_tokens
        n = len(job.blocks)
        ends = []
        pos = job.resume + chunk
        while pos < job.input_tokens:
            b = min(pos // B, n)
            if b > (ends[-1] if ends else 0):
                ends.append(b)
            pos += chunk
        return [b for b in ends if b < n or b * B < job.input_tokens]

    def run(self, progress: Callable[[int], None] | None = None) -> RunResult:
        r, st, cost, clock = self.r, self.r.settings, self.cost, self.clock
        engines, route = self.engines, self.route
        n = len(r.requests)
        ttft = np.full(n, np.nan)
        hit = np.zeros(n, dtype=np.int64)
        gpu_hit = np.zeros(n, dtype=np.int64)
        shared_kv = np.zeros(n, dtype=np.int64)
        dram = np.zeros(n)
        ssd = np.zeros(n)
        fleet = np.zeros(n)
        served_by = np.zeros(n, dtype=np.int64)
        arrival = np.zeros(n)
        bt = r.workload.block_size
        heap: list = []
        seq = 0

        def push(t: float, kind: int, payload) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (t, seq, kind, payload))

        arrival_gaps = st.gap == "arrival"

        def gap(sess, k: int) -> float:
            """Delay before request k of `sess`, from the end of request k - 1."""
            if arrival_gaps:
                reqs = sess.requests
                x = max(0.0, reqs[k].t - reqs[k - 1].t)
            else:
                x = sess.requests[k].think_time * st.think_scale
                if st.max_think is not None:
                    x = min(x, st.max_think)
            return min(x, st.max_delay) * st.time_scale

        def spawn_delay(x: float) -> float:
            return min(x, st.max_delay) * st.time_scale

        queue = list(reversed(r.order))  # pop() gives the next session to admit
        first = min(st.concurrency, len(queue))
        for i in range(first):
            s = queue.pop()
            ramp = st.ramp * i / first if first else 0.0
            push(r.sessions[s].start + ramp, _ARRIVE, (s, 0))
        for e in engines:
            e.shared = SharedPrefill(st.concurrent_prefills) \
                if st.concurrent_prefills > 1 else None
        # Every drive and fleet link; versions[i]: the version a _DRIVE wake is scheduled for.
        devices = [d for e in engines for d in (e.drive, e.fleet_link) if d is not None]
        versions = [-1] * len(devices)

        def read_done(payload) -> None:  # one restore read landed
            job = payload[2]
            job.reads -= 1
            if job.reads == 0:  # then: the copy
                push(clock.now, _COPY, payload)

        def fleet_read_done(payload) -> None:  # then the fleet tier's latency
            push(clock.now + engines[payload[2].engine].fleet_latency, _FLEET, payload)

        def flops_at(job: Job, blocks: int) -> float:
            return cost.prefill_flops(job.resume, min(blocks * bt, job.input_tokens))

        def prefilled_now(e: int, done: list) -> None:
            shared = engines[e].shared
            for p, i in shared.take_marks():
                push(clock.now, _STEP, (p, i))
            for p in done:
                push(clock.now, _PREFILLED, p)
            t = shared.next_completion()
            if t is not None:
                push(t, _WAKE, (e, shared.version))
        done = 0
        makespan = 0.0
        t0 = time.perf_counter()
        while True:
            for i, dev in enumerate(devices):  # a device's next completion may have moved
                if dev.version != versions[i]:
                    versions[i] = dev.version
                    t = clock.now if dev.has_done else dev.next_completion()
                    if t is not None:
                        push(t, _DRIVE, (i, versions[i]))
            if not heap:
                break
            now, _, kind, payload = heapq.heappop(heap)
            clock.now = now
            for dev in devices:
                for cb, arg in dev.advance(now):  # reads and writes done by now
                    cb(arg)
            if kind == _DRIVE:
                i, version = payload
                if version == versions[i]:  # the current wake: schedule the next one
                    versions[i] = -1  # (float error can leave a head a hair short)
                continue
            if kind == _FLEET:  # a fleet read and its latency are over
                payload[2].reads -= 1
                if payload[2].reads:
                    continue  # the SSD read is not
                kind = _COPY
            if kind == _ARRIVE:
                s, k = payload
                rid = r.offset[s] + k
                req = r.sessions[s].requests[k]
                job = Job(rid, req, r.blocks[rid], now, bt)
                arrival[rid] = now
                job.engine = e = route(job, s, engines)
                eng = engines[e]
                eng.outstanding += job.input_tokens
                eng.in_flight += 1
                eng.served += 1
                eng.policy.lookup(job)
                for delay, child in r.spawn.get((s, k), ()):
                    push(now + spawn_delay(delay), _ARRIVE, (child, 0))
                payload = (s, k, job)
                if job.ssd_bytes > 0:  # the drive first; the link is not held meanwhile
                    job.reads += 1
                    eng.drive.read(now, job.ssd_bytes, read_done, payload)  # then: copy
                if job.fleet_bytes > 0:  # beside the SSD read, on the engine's fleet link
                    job.reads += 1
                    eng.fleet_link.read(now, job.fleet_bytes, fleet_read_done, payload)
                if job.reads:
                    continue
                kind = _COPY if job.dram_bytes > 0 else _LOADED
            if kind == _COPY:  # the restored bytes over the host-to-device link
                job = payload[2]
                eng = engines[job.engine]
                start = max(now, eng.link_free)
                eng.link_free = start + cost.h2d_time(
                    job.dram_bytes + job.ssd_bytes + job.fleet_bytes)
                push(eng.link_free, _LOADED, payload)
                continue
            if kind == _LOADED:
                s, k, job = payload
                eng = engines[job.engine]
                eng.policy.loaded(job)
                work = cost.prefill_time(job.resume, job.input_tokens)
                if self.charge_chunk_ends:
                    forced = self.forced_steps(job)
                    self.extra_steps += forced
                    work += forced * cost.tpot
                # The share of the prefill done when each step ends (by FLOPs).
                total = cost.prefill_flops(job.resume, job.input_tokens)
                ends = self.step_ends(job)
                done_at = [flops_at(job, b) / total if total > 0 else 1.0 for b in ends]
                job.step_ends = ends
                if eng.shared is not None:
                    marks = [work * (1.0 - f) for f in done_at]
                    prefilled_now(job.engine, eng.shared.add(now, work, payload, marks))
                    continue
                start = max(now, eng.gpu_free)
                eng.gpu_free = start + work
                for i, f in enumerate(done_at):
                    push(start + f * work, _STEP, (payload, i))
                push(eng.gpu_free, _PREFILLED, payload)
            elif kind == _STEP:
                (s, k, job), i = payload
                engines[job.engine].policy.store_step(job, job.step_ends[i])
            elif kind == _WAKE:
                e, version = payload
                if version == engines[e].shared.version:  # else the active set changed
                    prefilled_now(e, engines[e].shared.wake(now))
            elif kind == _PREFILLED:
                s, k, job = payload
                rid = job.rid
                eng = engines[job.engine]
                eng.outstanding -= job.input_tokens
                job.first_token = now
                ttft[rid] = now - job.arrival
                hit[rid] = job.resume
                gpu_hit[rid] = job.gpu_hit
                shared_kv[rid] = max(job.shared, job.resume)
                dram[rid] = job.dram_bytes
                ssd[rid] = job.ssd_bytes
                fleet[rid] = job.fleet_bytes
                served_by[rid] = job.engine
                eng.policy.prefilled(job)
                push(now + cost.decode_time(job.req.output_tokens), _FINISHED, payload)
                done += 1
                if progress is not None:
                    progress(1)
            elif kind == _FINISHED:
                s, k, job = payload
                makespan = now
                engines[job.engine].in_flight -= 1
                engines[job.engine].policy.finished(job)
                sess = r.sessions[s]
                if k + 1 < len(sess.requests):
                    push(now + gap(sess, k + 1), _ARRIVE, (s, k + 1))
                elif (sess.kind == "main" or sess.parent is None) and queue:
                    push(now, _ARRIVE, (queue.pop(), 0))
        assert done == n, f"{done} of {n} requests completed"
        return RunResult(
            policy=engines[0].policy.name, ttft=ttft, hit=hit, gpu_hit=gpu_hit,
            shared=shared_kv, dram_bytes=dram, ssd_bytes=ssd, arrival=arrival,
            makespan=makespan, wall_s=time.perf_counter() - t0,
            stats=_merged_stats(engines, self.extra_steps), engine=served_by,
            fleet_bytes=fleet,
        )
