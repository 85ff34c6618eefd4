"""Replay agent traces against prefix caches for hybrid models, simulated or live.

Input side: normalised workload types, trace loaders, synthetic workloads. Simulator
(`simulate.py`, `sim/`, `policies/`, `costmodel.py`, `metrics.py`): discrete-event replay
against HiState (the real `histate_vllm.policy` core) and the paper's baselines. `live.py`:
replay against a running OpenAI-compatible server. CLI: `python -m trace_replay --help`.
Pure Python + numpy + msgspec (no torch/vLLM), so the simulator can run anywhere.

    from trace_replay import load, synth
    wl = load("../shared/traces/weka")            # Workload of Sessions of Requests
    mb = synth.mutation_benchmark(p=0.05, seed=1)

    from trace_replay.simulate import SimConfig, simulate
    report = simulate(wl, ["histate", "vllm-disk", "unlimited"], SimConfig())
"""

from .loaders import FORMATS, TraceFormatError, detect_format, load
from .model import Request, Session, Workload, check_chained, coarsen, rekey

__all__ = [
    "FORMATS",
    "Request",
    "Session",
    "TraceFormatError",
    "Workload",
    "check_chained",
    "coarsen",
    "detect_format",
    "load",
    "rekey",
]
