"""The GPU's prefill queue when vLLM lets several prefills advance together.

By default vLLM 0.32 gives a running prefill the whole token budget of a step
(`long_prefill_token_threshold` = 0), so prefills run one after another in arrival order: the
simulator's FIFO queue. With `--long-prefill-token-threshold T` (and several requests
eligible) each prefill gets at most T tokens a step, and the rest of the budget B
(`max_num_batched_tokens`) goes to the next requests in line, so up to k = B / T prefills
advance at once. `SharedPrefill` is the fluid version of that: up to `k` prefills, admitted
in arrival order, share the GPU's prefill throughput equally; the others wait. With k = 1 it
is the FIFO queue. A step's efficiency does not depend on how its tokens are split.
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
        self.active: list[list] = []  # [remaining GPU seconds, payload]
        self.waiting: deque[list] = deque()
        self.version = 0  # bumped whenever the next completion time may have changed

    def _advance(self, now: float) -> list:
        """Run the active prefills up to `now`; return the payloads that finished."""
        if self.active and now > self.t:
            share = (now - self.t) / len(self.active)
            for a in self.active:
                a[0] -= share
        self.t = max(self.t, now)
        done: list = []
        while True:  # a prefill admitted to a freed place may itself be empty
            done += [a[1] for a in self.active if a[0] <= _EPS]
            self.active = [a for a in self.active if a[0] > _EPS]
            if not self.waiting or len(self.active) >= self.k:
                return done
            while self.waiting and len(self.active) < self.k:
                self.active.append(self.waiting.popleft())

    def add(self, now: float, seconds: float, payload) -> list:
        """A prefill of `seconds` of GPU time joins the queue; returns prefills finished."""
        self.waiting.append([max(seconds, 0.0), payload])  # behind the others, not yet run
        done = self._advance(now)  # a free place, or a zero-length prefill, takes effect now
        self.version += 1
        return done

    def wake(self, now: float) -> list:
        done = self._advance(now)
        self.version += 1
        return done

    def next_completion(self) -> float | None:
        if not self.active:
            return None
        return self.t + min(a[0] for a in self.active) * len(self.active)
