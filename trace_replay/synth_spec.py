"""Name a synthetic workload on the command line: "mutation:p=0.05,seed=1",
"rewind-edit:p=0.2,n_sessions=8,turns=20", "mixed".

Keys are the generator's keyword arguments; for the agent patterns also `Shape`'s fields.
"""

from __future__ import annotations

import inspect

import msgspec

from . import synth
from .model import Workload

GENERATORS = {
    "mutation": synth.mutation_benchmark,
    "append": synth.append_pattern,
    "rewind-edit": synth.rewind_edit_pattern,
    "truncation": synth.truncation_pattern,
    "compaction": synth.compaction_pattern,
    "subagent-fork": synth.subagent_fork_pattern,
    "mixed": synth.mixed_agent_pattern,
}
_SHAPE_FIELDS = set(synth.Shape.__struct_fields__)


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in GENERATORS:
        raise ValueError(f"unknown synthetic workload {name!r}; valid: {', '.join(GENERATORS)}")
    kwargs = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = part.partition("=")
        if not eq:
            raise ValueError(f"{spec!r}: expected key=value, got {part!r}")
        kwargs[key.strip().replace("-", "_")] = _value(val.strip())
    return name, kwargs


def generate(spec: str) -> Workload:
    name, kwargs = parse(spec)
    fn = GENERATORS[name]
    params = inspect.signature(fn).parameters
    if "shape" in params:
        shape_kw = {k: v for k, v in kwargs.items() if k in _SHAPE_FIELDS}
        own = {k: v for k, v in kwargs.items() if k not in _SHAPE_FIELDS}
        bad = [k for k in own if k not in params or k == "shape"]
        if bad:
            raise ValueError(f"{name}: unknown option(s) {bad}; valid: "
                             f"{sorted(_SHAPE_FIELDS | set(params) - {'shape'})}")
        return fn(msgspec.structs.replace(synth.DEFAULT_SHAPE, **shape_kw), **own)
    bad = [k for k in kwargs if k not in params]
    if bad:
        raise ValueError(f"{name}: unknown option(s) {bad}; valid: {sorted(params)}")
    return fn(**kwargs)
