"""Record every call a caller makes on a policy, and replay it offline.

Set HISTATE_POLICY_RECORD=/path/file before the engine starts (make_policy wraps the policy
it builds); then `replay(path, "histate" | "lru")` re-runs the same calls, at the same clock
readings, on a fresh policy, to debug a decision or compare policies without an engine.
File: a sequence of pickles, the first (make_policy kwargs), then (clock, method, args).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

_RECORDED = (
    "admit", "committed", "keep", "demotions", "pin", "unpin", "hit", "remove",
    "plan_captures", "restorable", "request_finished", "restore_resident", "set_budget",
    "observe_gpu", "where", "set_step_cost",
)


class Recorder:
    """A transparent proxy: forwards everything, logs the mutating and lookup calls."""

    def __init__(self, inner, path: str, kwargs: dict[str, Any]):
        self._inner = inner
        self._f = open(path, "wb")  # noqa: SIM115 - lives as long as the policy
        kw = {k: v for k, v in kwargs.items() if k != "clock"}
        pickle.dump(kw, self._f)

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name not in _RECORDED:
            return attr

        def call(*args, **kwargs):
            args = tuple(list(a) if _is_iter(a) else a for a in args)
            pickle.dump((self._inner.clock(), name, args, kwargs), self._f)
            self._f.flush()
            return attr(*args, **kwargs)

        return call


def _is_iter(a) -> bool:
    return not isinstance(a, (bytes, str, int, float, dict, list, tuple)) and hasattr(a, "__iter__")


def read(path: str):
    with open(path, "rb") as f:
        kwargs = pickle.load(f)
        calls = []
        while True:
            try:
                calls.append(pickle.load(f))
            except EOFError:
                break
    return kwargs, calls


def replay(path: str, policy: str | None = None,
           on_call: Callable[[Any, str, tuple, Any], None] | None = None):
    """Re-run a recording; returns the policy. `on_call(core, method, args, result)`."""
    from . import make_policy

    kwargs, calls = read(path)
    if policy is not None:
        kwargs["name"] = policy
    now = [0.0]
    core = make_policy(clock=lambda: now[0], record=None, **kwargs)
    for t, name, args, kw in calls:
        now[0] = t
        result = getattr(core, name)(*args, **kw)
        if on_call is not None:
            on_call(core, name, args, result)
    return core
