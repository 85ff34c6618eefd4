"""What a simulated caching system does for each request, and what it is given to do it.

The engine calls, per request, in this order:
  lookup(job)      on arrival: decide the resume point and what to restore from where; pin it
  loaded(job)      the restore transfer finished (unpin)
  prefilled(job)   prefill done (first token): the GPU now holds the prompt; store/offload it
  finished(job)    decode done: the request lets go of its GPU blocks
The clock (`ctx.clock()`) reads simulated seconds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ..costmodel import CostModel
from ..sim.job import Job


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Budgets and geometry every policy gets (the same for all of them)."""

    cost: CostModel
    block_tokens: int
    gpu_bytes: int
    dram_bytes: int
    ssd_bytes: int
    chunk_tokens: int  # prefill chunk (vLLM max_num_batched_tokens / SGLang chunked prefill)
    clock: Callable[[], float]
    # Options for HiState's policy core (`make_policy(..., **options)`: tau, terminal_alpha,
    # terminal_reuse, ...): sensitivity runs; the defaults are what the connector ships.
    core_options: dict = field(default_factory=dict)

    @property
    def kv_block_bytes(self) -> int:
        return self.block_tokens * self.cost.model.kv_bytes_per_token

    @property
    def state_bytes(self) -> int:
        return self.cost.model.state_bytes


class SimPolicy(ABC):
    name: str = ""

    def __init__(self, ctx: PolicyContext):
        self.ctx = ctx
        self.B = ctx.block_tokens

    @abstractmethod
    def lookup(self, job: Job) -> None: ...

    def loaded(self, job: Job) -> None:
        pass

    @abstractmethod
    def prefilled(self, job: Job) -> None: ...

    def finished(self, job: Job) -> None:
        pass

    def stats(self) -> dict:
        return {}
