"""docs/configuration.md and docs/metrics.md against the code, so they cannot drift: every
option with its default, every metric with its type and labels, every miss cause."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from histate_vllm.bookkeeping.telemetry import CAUSES
from histate_vllm.config import HiStateConfig

DOCS = Path(__file__).resolve().parents[1] / "docs"


def rows(path: Path, header: str) -> list[list[str]]:
    """The cells of the markdown table under the header row starting with `header`."""
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {header} |"))
    out = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        out.append([c.strip() for c in ln.strip("|").split(" | ")])
    return out


def code(cell: str) -> str:
    (name,) = re.findall(r"^`([^`]+)`$", cell)
    return name


def test_every_option_with_its_default():
    table = {code(r[0]): r[1] for r in rows(DOCS / "configuration.md", "key")}
    fields = {f.name: f for f in dataclasses.fields(HiStateConfig)}
    assert table.keys() == fields.keys()
    for name, f in fields.items():
        if f.default is dataclasses.MISSING:
            assert table[name] == "required", name
        else:
            assert json.loads(code(table[name])) == f.default, name


def test_every_metric_with_its_type_and_labels():
    from vllm.v1.kv_offload.base import (
        OffloadingCounterMetadata,
        OffloadingGaugeMetadata,
        OffloadingHistogramMetadata,
    )

    from histate_vllm.vllm_glue.offloading_spec import CONFIG_INFO_KEYS
    from histate_vllm.vllm_glue.prom_metrics import definitions

    kinds = {OffloadingCounterMetadata: "counter", OffloadingGaugeMetadata: "gauge",
             OffloadingHistogramMetadata: "histogram"}
    want = {name: (kinds[type(md)], tuple(md.labelnames or ()))
            for name, md in definitions().items()}
    # vLLM 0.33+'s config-info series (prom_metrics.HiStatePromMetrics fills its labels).
    want["vllm:kv_offload_config_info"] = ("gauge", CONFIG_INFO_KEYS)
    table = rows(DOCS / "metrics.md", "metric")
    got = {code(r[0]): (r[1], tuple(re.findall(r"`([^`]+)`", r[2]))) for r in table}
    assert got == want


def test_every_miss_cause():
    table = rows(DOCS / "metrics.md", "cause")
    assert tuple(code(r[0]) for r in table) == CAUSES
