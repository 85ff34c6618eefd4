"""Where a trace folder's KV goes dead: the shares the raw replay's "dead data" prose quotes.

    python benchmarks/dead_data.py ../shared/traces/weka-more

Per session, every block it writes is last read either by its final request (the session
ends) or by an earlier one (a later prompt replaced it: an edit, a rewind, a compaction);
of the replaced blocks, the share whose prompt left the old one at or inside its first
message (system prompt and tools: a compaction, or what a new session sharing them looks
like). Blocks that several sessions read are counted apart. Also the folder's KV in all,
at Qwen3.5-9B's bytes per token.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trace_replay.costmodel import QWEN35_9B  # noqa: E402
from trace_replay.loaders import load  # noqa: E402
from trace_replay.model import Workload  # noqa: E402


def shares(wl: Workload) -> dict[str, float]:
    users: dict[int, set[int]] = defaultdict(set)
    for si, s in enumerate(wl.sessions):
        for r in s.requests:
            for b in r.block_hashes.tolist():
                users[b].add(si)
    ended = replaced = shared = at_first = 0
    for si, s in enumerate(wl.sessions):
        prompts = [r.block_hashes.tolist() for r in s.requests]
        last: dict[int, int] = {}
        for k, blocks in enumerate(prompts):
            for b in blocks:
                last[b] = k
        for b, k in last.items():
            if len(users[b]) > 1:
                shared += 1
            elif k == len(prompts) - 1:
                ended += 1
            else:
                replaced += 1
        # Blocks a prompt drops from the one before it, by where the two part.
        for k in range(1, len(prompts)):
            old, new = prompts[k - 1], prompts[k]
            p, n = 0, min(len(old), len(new))
            while p < n and old[p] == new[p]:
                p += 1
            if p * wl.block_size <= (s.requests[k].message_end or 0) + wl.block_size:
                at_first += sum(1 for b in old[p:] if last[b] == k - 1 and len(users[b]) == 1)
    total = ended + replaced + shared
    tb = total * wl.block_size * QWEN35_9B.kv_bytes_per_token / 1e12
    return {"blocks": total, "KV TB (Qwen3.5-9B)": tb,
            "last read by the session's final request": ended / total,
            "last read before it (replaced)": replaced / total,
            "read by several sessions": shared / total,
            "replaced at or inside the first message": at_first / max(replaced, 1)}


def main() -> None:
    for folder in sys.argv[1:]:
        for name, v in shares(load(folder)).items():
            shown = v if name == "blocks" else f"{v:.2f}" if "TB" in name else f"{v:.1%}"
            print(f"{folder}: {name}: {shown}")


if __name__ == "__main__":
    main()
