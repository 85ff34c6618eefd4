"""Discrete-event replay of a workload against one simulated caching system.

Closed loop, as in the HiState paper §4.1: at most `concurrency` main sessions are live; the
first ones start at their recorded offsets (plus an optional ramp), and whenever a main
session's last request finishes, the next one (seeded random order) starts. A subagent starts
when its parent sends the request it was spawned after (plus the recorded offset). Within a
session, request k+1 is sent `think_time` after request k's last output token.

Each request: arrival -> restore (one host-to-device link, FIFO; SSD reads add their own
time, paper eq. 2) -> prefill (one compute queue, FIFO, i.e. vLLM's FCFS scheduler with the
GPU saturated by one prefill at a time) -> first token (TTFT = now - arrival, queueing
included) -> decode (output_tokens steps; decode does not hold the prefill queue).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..costmodel import CostModel
from ..model import Workload
from .job import Job

if TYPE_CHECKING:
    from ..policies.base import SimPolicy

_ARRIVE, _LOADED, _PREFILLED, _FINISHED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    concurrency: int = 24
    seed: int = 0
    ramp: float = 0.0  # initial sessions are admitted spread over this many seconds
    think_scale: float = 1.0
    max_think: float | None = None  # cap on one think/tool gap, s


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
    dram_bytes: np.ndarray
    ssd_bytes: np.ndarray
    arrival: np.ndarray
    makespan: float
    wall_s: float
    stats: dict = field(default_factory=dict)


class Replay:
    """The workload's static structure: request ids, session order, subagent spawn points."""

    def __init__(self, workload: Workload, settings: ReplaySettings):
        self.workload = workload
        self.settings = settings
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


class Simulator:
    def __init__(self, replay: Replay, cost: CostModel, policy: SimPolicy, clock: SimClock):
        self.r = replay
        self.cost = cost
        self.policy = policy
        self.clock = clock

    def run(self, progress: Callable[[int], None] | None = None) -> RunResult:
        r, st, cost, policy, clock = self.r, self.r.settings, self.cost, self.policy, self.clock
        n = len(r.requests)
        ttft = np.full(n, np.nan)
        hit = np.zeros(n, dtype=np.int64)
        gpu_hit = np.zeros(n, dtype=np.int64)
        dram = np.zeros(n)
        ssd = np.zeros(n)
        arrival = np.zeros(n)
        bt = r.workload.block_size
        heap: list = []
        seq = 0

        def push(t: float, kind: int, payload) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (t, seq, kind, payload))

        def think(req) -> float:
            x = req.think_time * st.think_scale
            return x if st.max_think is None else min(x, st.max_think)

        queue = list(reversed(r.order))  # pop() gives the next session to admit
        first = min(st.concurrency, len(queue))
        for i in range(first):
            s = queue.pop()
            ramp = st.ramp * i / first if first else 0.0
            push(r.sessions[s].start + ramp, _ARRIVE, (s, 0))
        link_free = 0.0
        gpu_free = 0.0
        done = 0
        t0 = time.perf_counter()
        while heap:
            now, _, kind, payload = heapq.heappop(heap)
            clock.now = now
            if kind == _ARRIVE:
                s, k = payload
                rid = r.offset[s] + k
                req = r.sessions[s].requests[k]
                job = Job(rid, req, r.blocks[rid], now, bt)
                arrival[rid] = now
                policy.lookup(job)
                for delay, child in r.spawn.get((s, k), ()):
                    push(now + delay, _ARRIVE, (child, 0))
                load = cost.load_time(job.dram_bytes, job.ssd_bytes)
                if load > 0:
                    start = max(now, link_free)
                    link_free = start + load
                    push(link_free, _LOADED, (s, k, job))
                    continue
                kind, payload = _LOADED, (s, k, job)
            if kind == _LOADED:
                s, k, job = payload
                policy.loaded(job)
                start = max(now, gpu_free)
                gpu_free = start + cost.prefill_time(job.resume, job.input_tokens)
                push(gpu_free, _PREFILLED, payload)
            elif kind == _PREFILLED:
                s, k, job = payload
                rid = job.rid
                job.first_token = now
                ttft[rid] = now - job.arrival
                hit[rid] = job.resume
                gpu_hit[rid] = job.gpu_hit
                dram[rid] = job.dram_bytes
                ssd[rid] = job.ssd_bytes
                policy.prefilled(job)
                push(now + cost.decode_time(job.req.output_tokens), _FINISHED, payload)
                done += 1
                if progress is not None:
                    progress(1)
            elif kind == _FINISHED:
                s, k, job = payload
                policy.finished(job)
                sess = r.sessions[s]
                if k + 1 < len(sess.requests):
                    push(now + think(sess.requests[k + 1]), _ARRIVE, (s, k + 1))
                elif (sess.kind == "main" or sess.parent is None) and queue:
                    push(now, _ARRIVE, (queue.pop(), 0))
        assert done == n, f"{done} of {n} requests completed"
        return RunResult(
            policy=policy.name, ttft=ttft, hit=hit, gpu_hit=gpu_hit, dram_bytes=dram,
            ssd_bytes=ssd, arrival=arrival, makespan=clock.now,
            wall_s=time.perf_counter() - t0, stats=policy.stats(),
        )
