"""A request in flight through the simulator, and what a policy decided for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import Request


@dataclass(slots=True)
class Job:
    """One request being served.

    Prompt geometry (B = block size): `blocks` = ids of the full blocks (`len == L // B`);
    `max_blocks` = (L - 1) // B, the deepest hit vLLM allows (one token must be computed);
    `prompt_end` = max_blocks * B, where the prompt-end checkpoint goes.

    A policy's `lookup` sets `resume` (tokens reused), `gpu_hit` (of which served by the GPU
    prefix cache), `shared` (longest cached KV prefix, state or not), the bytes it restores
    from DRAM and SSD, and `captures` (checkpoint positions this request will leave).
    """

    rid: int
    req: Request
    blocks: list[int]
    arrival: float
    block_tokens: int
    resume: int = 0
    gpu_hit: int = 0
    shared: int = 0
    dram_bytes: float = 0.0
    ssd_bytes: float = 0.0
    # Bytes restored from a fleet tier over the engine's fleet link (sim/fleet.py).
    fleet_bytes: float = 0.0
    captures: list[int] = field(default_factory=list)
    state: object = None  # policy-private
    first_token: float = 0.0
    # Blocks computed by the end of each prefill chunk but the last (set by the simulator),
    # and how many of the prompt's blocks the policy has stored so far.
    step_ends: list[int] = field(default_factory=list)
    stored: int = 0
    engine: int = 0  # which engine of a fleet serves it (0: the only one)
    reads: int = 0  # restore reads (SSD, fleet) still in flight
    _hb: list[bytes] | None = None

    @property
    def input_tokens(self) -> int:
        return self.req.input_tokens

    @property
    def max_blocks(self) -> int:
        return max(0, (self.req.input_tokens - 1) // self.block_tokens)

    @property
    def prompt_end(self) -> int:
        return self.max_blocks * self.block_tokens

    @property
    def request_id(self) -> str:
        return f"{self.req.session_id}#{self.req.index}"

    def hashes_bytes(self) -> list[bytes]:
        """Block ids as 8-byte big-endian strings (the policy core's block hashes)."""
        if self._hb is None:
            raw = self.req.block_hashes.astype(">i8").tobytes()
            self._hb = [raw[i : i + 8] for i in range(0, len(raw), 8)]
        return self._hb
