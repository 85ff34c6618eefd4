"""The discrete-event simulator: engine (event loop), GPU prefix cache, LRU tiers."""

from .engine import Replay, ReplaySettings, RunResult, SimClock, Simulator
from .job import Job

__all__ = ["Job", "Replay", "ReplaySettings", "RunResult", "SimClock", "Simulator"]
