"""SSD write outcomes from every worker rank, combined into one outcome per key.

With tensor parallelism each rank writes its own shard of a key's page from its own
DRAM slot, and ranks finish at different steps. A key is on SSD only when every rank
has written it: until then some rank's writer may still be reading the DRAM slot, so
the scheduler must not free (or reuse) it. Within a step vLLM merges the ranks'
reports with `merge`; across steps `SSDReportTally` counts them up to the number of
ranks and releases a key's outcome (all ranks ok) only then.

A report is `key -> (ranks that finished, all of them ok)`. The scheduler issues a
key's next write only after the previous one is released, so counts never mix writes.
"""

from __future__ import annotations

Report = dict[bytes, tuple[int, bool]]


def merge(a: Report, b: Report) -> Report:
    out = dict(a)
    for key, (n, ok) in b.items():
        m, ok_a = out.get(key, (0, True))
        out[key] = (m + n, ok_a and ok)
    return out


class SSDReportTally:
    def __init__(self, num_ranks: int):
        if num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
        self.num_ranks = num_ranks
        self._partial: Report = {}

    def add(self, report: Report) -> dict[bytes, bool]:
        """Count a step's (merged) report; return the keys every rank has now finished."""
        done: dict[bytes, bool] = {}
        for key, (n, ok) in report.items():
            m, ok_before = self._partial.pop(key, (0, True))
            m, ok = m + n, ok_before and ok
            if m > self.num_ranks:
                raise AssertionError(
                    f"{m} SSD reports for key {key.hex()[:16]}… from {self.num_ranks} ranks"
                )
            if m == self.num_ranks:
                done[key] = ok
            else:
                self._partial[key] = (m, ok)
        return done

    def pending(self) -> int:
        """Keys some rank but not all have reported."""
        return len(self._partial)
