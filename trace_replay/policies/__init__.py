"""Simulated caching systems, by name (`make(name, ctx)`)."""

from __future__ import annotations

from .base import PolicyContext, SimPolicy
from .histate import AlignAblation, Fixed32Ablation, HiState, LruDiskAblation, MirrorAblation
from .oracle import DeadDataOracle
from .sglang import SglangHiCache, SglangHiCacheChunks
from .unlimited import Unlimited, UnlimitedHost
from .vllm import NATIVE as _NATIVE
from .vllm import VllmCpu, VllmDisk, VllmDiskAlign, VllmMarconi

_CLASSES: dict[str, type[SimPolicy]] = {
    c.name: c
    for c in (HiState, VllmMarconi, VllmCpu, VllmDisk, SglangHiCache, Unlimited, UnlimitedHost,
              AlignAblation, Fixed32Ablation, LruDiskAblation, MirrorAblation,
              VllmDiskAlign, SglangHiCacheChunks, *_NATIVE, DeadDataOracle)
}
POLICIES = tuple(_CLASSES)
# References that know the replay's future: run only when named (not by "all").
ORACLES = (DeadDataOracle.name,)
BASELINES = ("vllm-marconi", "vllm-cpu", "vllm-disk", "sglang-hicache")
VARIANTS = ("vllm-disk-align", "sglang-hicache-chunks")  # ambiguous baselines, side by side
ABLATIONS = ("align", "fixed-32", "lru-disk", "histate-mirror")
# vLLM 0.34's own hybrid offloading, swept over eviction and retention interval.
NATIVE = tuple(c.name for c in _NATIVE)


def make(name: str, ctx: PolicyContext) -> SimPolicy:
    try:
        cls = _CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}") from None
    return cls(ctx)


__all__ = ["ABLATIONS", "BASELINES", "NATIVE", "ORACLES", "VARIANTS", "POLICIES",
           "PolicyContext", "SimPolicy", "make"]
