"""Reference with knowledge of the future: HiState that knows which data is dead.

`histate-oracle` is HiState (the same core, orchestration and budgets) that drops every KV
chunk and state no later request of the replay uses, as soon as the last request using it
finishes. A real cache cannot know this; the reference measures how much of HiState's
distance to Unlimited-host is capacity spent on dead data (sessions that ended, prompts an
agent replaced by an edit, a rewind or a compaction) rather than capacity as such. Not run
by `--policies all`; name it.
"""

from __future__ import annotations

from collections import Counter

from ..sim.job import Job
from .histate import _KVS, _STS, HiState


class DeadDataOracle(HiState):
    name = "histate-oracle"

    def bind_replay(self, replay) -> None:
        self.future = Counter()  # block id -> requests not yet arrived that contain it
        for blocks in replay.blocks:
            self.future.update(set(blocks))
        self.n["oracle_dropped"] = 0

    def lookup(self, job: Job) -> None:
        super().lookup(job)
        future = self.future
        for b in set(job.blocks):
            future[b] -= 1

    def finished(self, job: Job) -> None:
        super().finished(job)
        future, hb = self.future, job.hashes_bytes()
        # Deepest first: a KV chunk's loss takes the states below it along (one walk each).
        keys = [hb[i] + g for i in range(len(job.blocks) - 1, -1, -1)
                if future[job.blocks[i]] <= 0 for g in (_STS, _KVS)]
        self.n["oracle_dropped"] += self.orch.discard(keys, "no later request uses it")
