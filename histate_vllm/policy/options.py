"""The histate policy's tuning options (`make_policy`'s planner counts and the core's
`**options`), checked up front: a wrong value is named with what it must be, before any
decision is made with it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _flag(v) -> bool:
    return isinstance(v, bool) or (isinstance(v, int) and v in (0, 1))


# name -> (accepts the value, what it must be)
OPTIONS: dict[str, tuple[Callable[[object], bool], str]] = {
    "max_intermediate": (_count, "an int >= 0 (0: no interval checkpoints)"),
    "learn_min_tokens": (_count, "tokens, an int >= 0"),
    "tau": (lambda v: v is None or (_real(v) and v > 0), "seconds > 0 (unset: learned)"),
    "terminal_alpha": (lambda v: _real(v) and 0 < v <= 1, "an EMA weight in (0, 1]"),
    "terminal_reuse": (lambda v: v is None or (_real(v) and 0 <= v <= 1),
                       "a probability in [0, 1] (unset: learned)"),
    "kv_bytes_per_token": (lambda v: v is None or (_real(v) and v > 0),
                           "bytes > 0 (unset: learned)"),
    "keep_backups": (_flag, "true or false"),
    "drop_stuck": (_flag, "true or false"),
    "states_lead": (_flag, "true or false"),
    "credit": (_flag, "true or false"),
}


def check_options(options: Mapping[str, object]) -> None:
    """Raise ValueError naming the first unknown option or bad value."""
    for name, value in options.items():
        if name not in OPTIONS:
            raise ValueError(f"unknown option {name!r} of the histate policy; valid: "
                             f"{', '.join(OPTIONS)}")
        ok, what = OPTIONS[name]
        if not ok(value):
            raise ValueError(f"histate policy option {name} must be {what}, got {value!r}")
