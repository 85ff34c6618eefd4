"""What a simulated caching system does for each request, and what it is given to do it.

The engine calls, per request, in this order:
  lookup(job)      on arrival: decide the resume point and what to restore from where; pin it
  loaded(job)      the restore transfer finished (unpin)
  store_step(job, b)  a prefill chunk ended: the prompt's first b blocks are computed
                      (vLLM offers them to the offloading connector at the step's end)
  prefilled(job)   prefill done (first token): the GPU now holds the prompt; store/offload
                   the rest
  finished(job)    decode done: the request lets go of its GPU blocks
The clock (`ctx.clock()`) reads simulated seconds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ..costmodel import CostModel
from ..sim.drive import Drive
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
    # One more prefill step in tokens of prefill (CostModel.step_cost_tokens) where the
    # simulator charges chunk ends; 0 where they are free. HiState's planner is told it.
    step_cost_tokens: float = 0.0
    # Options for HiState's policy core (`make_policy(..., **options)`: tau, terminal_alpha,
    # terminal_reuse, ...): sensitivity runs; the defaults are what the connector ships.
    core_options: dict = field(default_factory=dict)
    # The SSD (shared with the simulator: restores read it, SSD copies are written to it
    # through its bounded queue). None: writes are free and never dropped.
    drive: Drive | None = None
    # Whether the client's breakpoints (Request.breakpoints) reach the server: HiState's
    # planner checkpoints there (as the connector does with kv_transfer_params).
    client_breakpoints: bool = True

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

    def store_step(self, job: Job, blocks: int) -> None:
        """Blocks [job.stored, blocks) are computed; a policy that offloads stores them."""

    def ssd_write(self, nbytes: int, cb, arg) -> bool:
        """Queue an SSD write on the drive; False if its queue drops it. `cb(arg)` once
        written (later, from the simulator's event loop)."""
        drive = self.ctx.drive
        if drive is None:
            cb(arg)
            return True
        return drive.write(self.ctx.clock(), nbytes, cb, arg)

    @abstractmethod
    def prefilled(self, job: Job) -> None: ...

    def finished(self, job: Job) -> None:
        pass

    def bind_replay(self, replay) -> None:
        """The whole replay, before it starts (only references that know the future use it)."""

    def stats(self) -> dict:
        return {}
