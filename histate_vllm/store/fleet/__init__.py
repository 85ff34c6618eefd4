"""The fleet tier: checkpoints and KV chunks shared by every engine of a fleet, on Mooncake
Store or a shared POSIX directory (no vLLM, no torch). `tier.FleetTier` publishes and
restores; `backends` holds the two places objects live; `objects` what an object is and how
it is checked."""

from histate_vllm.store.fleet.backends import (
    DirBackend,
    FleetUnavailable,
    FleetWriteFailed,
    MooncakeBackend,
)
from histate_vllm.store.fleet.tier import MISS_CAUSES, FleetMiss, FleetTier, Restored

__all__ = ["DirBackend", "FleetMiss", "FleetTier", "FleetUnavailable", "FleetWriteFailed",
           "MISS_CAUSES", "MooncakeBackend", "Restored"]
