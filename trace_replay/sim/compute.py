"""The GPU's prefill queue when vLLM lets several prefills advance together.

By default vLLM 0.32 gives a running prefill the whole token budget of a step
(`long_prefill_token_threshold` = 0), so prefills run one after another in arrival order: the
simulator's FIFO queue. With `--long-prefill-token-threshold T` (and several requests
eligible) each prefill gets at most T tokens a step, and the rest of the budget B
(`max_num_batched_tokens`) goes to the next requests in line, so up to k = B / T prefills
advance at once. `SharedPrefill` is the fluid version of that: up to `k` prefills, admitted
in arrival order, share the GPU's prefill throughput equally; the others wait. With k = 1 it
is the FIFO queue. A step's efficiency does not depend on how its tokens are split.

Marks: a prefill may carry the GPU seconds still left when each of its steps ends (vLLM
stores a step's KV when the step ends); `take_marks` returns (payload, mark index) for the
marks passed, at the time they are passed (`next_completion` counts them as events).
"""

from __future__ import annotations

from collections import deque

_EPS = 1e-9  # s; float error on times of ~1e5 s is ~1e-11


class SharedPrefill:
    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"concurrent prefills must be >= 1, got {k}")
        self.k = k
        self.t = 0.0
        self.active: list[list] = []  # [remaining GPU seconds, payload, marks, next mark]
        self.waiting: deque[list] = deque()
        self.version = 0  # bumped whenever the next completion time may have changed
        self._marks: list[tuple[object, int]] = []

    def _advance(self, now: float) -> list:
        """Run the active prefills up to `now`; return the payloads that finished."""
        if self.active and now > self.t:
            share = (now - self.t) / len(self.active)
            for a in self.active:
                a[0] -= share
        self.t = max(self.t, now)
        done: list = []
        while True:  # a prefill admitted to a freed place may itself be empty
            for a in self.active:
                marks = a[2]
                while a[3] < len(marks) and a[0] <= marks[a[3]] + _EPS:
                    self._marks.append((a[1], a[3]))
                    a[3] += 1
            done += [a[1] for a in self.active if a[0] <= _EPS]
            self.active = [a for a in self.active if a[0] > _EPS]
            if not self.waiting or len(self.active) >= self.k:
                return done
            while self.waiting and len(self.active) < self.k:
                self.active.append(self.waiting.popleft())

    def add(self, now: float, seconds: float, payload, marks: list[float] = ()) -> list:
        """A prefill of `seconds` of GPU time joins the queue; returns prefills finished.
        marks: GPU seconds left at each step end, descending (see `take_marks`)."""
        # behind the others, not yet run
        self.waiting.append([max(seconds, 0.0), payload, list(marks), 0])
        done = self._advance(now)  # a free place, or a zero-length prefill, takes effect now
        self.version += 1
        return done

    def wake(self, now: float) -> list:
        done = self._advance(now)
        self.version += 1
        return done

    def take_marks(self) -> list[tuple[object, int]]:
        out, self._marks = self._marks, []
        return out

    def next_completion(self) -> float | None:
        if not self.active:
            return None
        left = min(a[0] - (a[2][a[3]] if a[3] < len(a[2]) else 0.0) for a in self.active)
        return self.t + max(left, 0.0) * len(self.active)
