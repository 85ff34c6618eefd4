"""Trace replay input side: normalised workload types, trace loaders, synthetic workloads.

Pure Python + numpy + msgspec (no torch/vLLM), so the simulator can run anywhere.

    from trace_replay import load, synth
    wl = load("../shared/traces/weka")            # Workload of Sessions of Requests
    mb = synth.mutation_benchmark(p=0.05, seed=1)
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
