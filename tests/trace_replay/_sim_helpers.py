"""Tiny hand-made workloads and a one-call simulator run for the policy tests."""

from __future__ import annotations

import numpy as np

from trace_replay.context import Context, Namespace
from trace_replay.costmodel import MODELS
from trace_replay.model import Request, Session, Workload
from trace_replay.sim import ReplaySettings
from trace_replay.simulate import SimConfig, prepare, run_policy

BS = 64
MB = 1 << 20
KVB = BS * MODELS["qwen3.5-9b"].kv_bytes_per_token  # one 64-token block: 2 MiB
SB = MODELS["qwen3.5-9b"].state_bytes  # one checkpoint: 49 MiB


class SessionBuilder:
    """Builds one session turn by turn; `extend`/`cut` edit the context like an agent."""

    def __init__(self, sid: str, start: float = 0.0, ns: str | None = None, base=None):
        self.sid, self.start = sid, start
        self.ctx = base.fork(Namespace("t", sid)) if base is not None else Context(
            Namespace("t", ns or sid), BS)
        self.reqs: list[Request] = []

    def turn(self, new_tokens: int, think: float = 1.0, out: int = 1, cut: int | None = None,
             label: str = "append") -> SessionBuilder:
        if cut is not None:
            self.ctx.keep(cut)
        self.ctx.append(new_tokens)
        k = len(self.reqs)
        self.reqs.append(Request(session_id=self.sid, index=k, t=float(k), think_time=
                                 think if k else 0.0, input_tokens=self.ctx.n_tokens,
                                 output_tokens=out, block_hashes=self.ctx.block_hashes(),
                                 label=label))
        return self

    def session(self) -> Session:
        return Session(id=self.sid, start=self.start, requests=tuple(self.reqs))


def workload(*builders: SessionBuilder, name: str = "t") -> Workload:
    return Workload(name=name, block_size=BS, sessions=tuple(b.session() for b in builders),
                    arrivals="synthetic").validate()


def run(wl: Workload, policy: str, *, gpu=64 * MB, dram=0, ssd=0, concurrency=24,
        chunk=None, device="h100", prefills=1, chunk_ends="free", breakpoints="declared"):
    cfg = SimConfig(device=device, gpu_bytes=gpu, dram_bytes=dram, ssd_bytes=ssd,
                    block_tokens=BS, chunk_tokens=chunk, chunk_ends=chunk_ends,
                    breakpoints=breakpoints,
                    replay=ReplaySettings(concurrency=concurrency,
                                          concurrent_prefills=prefills))
    prep = prepare(wl, cfg)
    return prep, run_policy(prep, policy)


def hits(prep, res) -> dict[tuple[str, int], int]:
    return {(r.session_id, r.index): int(h) for r, h in zip(prep.replay.requests, res.hit)}


def rid(prep, sid: str, index: int) -> int:
    for i, r in enumerate(prep.replay.requests):
        if r.session_id == sid and r.index == index:
            return i
    raise KeyError((sid, index))


def as_array(x) -> np.ndarray:
    return np.asarray(x)
