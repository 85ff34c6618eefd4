"""Answer "why was there no checkpoint at position P for this prompt".

Works on a live policy (`explain(policy, ...)`, also `PolicyCore.explain`) or offline on a
saved event log (`explain_log`, or the CLI below) from the events alone:

    python -m histate_vllm.policy.explain --events events.msgpack --hashes prompt.hex \\
        --block-tokens 256 --position 6144

`events.msgpack` is `encode_events(drained events)`; `prompt.hex` has one block hash per line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import events as ev
from .types import Kind


def _fmt(e: ev.Event) -> str:
    tier = e.tier.name if e.tier is not None else "-"
    kind = e.kind.name if e.kind is not None else ""
    s = f"t={e.t:.3f} {e.op} {kind} tier={tier}"
    if e.request_id:
        s += f" req={e.request_id}"
    if e.score is not None:
        s += f" H={e.score:.3f}"
    if e.reason:
        s += f": {e.reason}"
    return s


def _story(lines, node_events, plans, position) -> None:
    if node_events:
        lines.append("  history of this node:")
        lines.extend("    " + _fmt(e) for e in node_events)
        if not any(e.kind == Kind.STATE for e in node_events):
            lines.append("  no checkpoint (STATE) was ever offered here, only KV")
        else:
            last = [e for e in node_events if e.kind == Kind.STATE][-1]
            lines.append(f"  last checkpoint event: {last.op}" +
                         (f" ({last.reason})" if last.reason else ""))
    else:
        lines.append("  no admission, eviction or rejection was ever recorded for this node")
    planned = [p for p in plans if position in p.positions]
    if planned:
        ids = ", ".join(p.request_id for p in planned[-5:])
        lines.append(f"  planned by {ids}")
    elif plans:
        lines.append("  no recorded plan included it; recent plans:")
        lines.extend(f"    req={p.request_id} positions={p.positions} ({p.reason})"
                     for p in plans[-3:])


def _node_at(block_hashes: Sequence[bytes], position: int, bt: int) -> bytes | str:
    if position <= 0 or position % bt:
        return f"position {position}: not a block boundary (block size {bt}); never a checkpoint"
    i = position // bt - 1
    if i >= len(block_hashes):
        return (f"position {position}: beyond this prompt ({len(block_hashes)} blocks = "
                f"{len(block_hashes) * bt} tokens)")
    return block_hashes[i]


def explain(policy, block_hashes: Sequence[bytes], position: int) -> str:
    bt = policy.planner.block_tokens
    node = _node_at(block_hashes, position, bt)
    if isinstance(node, str):
        return node
    lines = [f"position {position}:"]
    hit = policy.restorable(block_hashes)
    state_groups = sorted(policy._groups[Kind.STATE])
    if hit.position == position:
        lines.append("  a checkpoint IS restorable here now"
                     + (f" (state from {hit.state_tier.name})" if hit.state_tier else ""))
    else:
        lines.append(f"  deepest restorable position now: {hit.position}; "
                     f"shared prefix: {hit.shared}")
        present = {g: policy.where(node + g.to_bytes(4, "big")) for g in state_groups}
        missing = [g for g, t in present.items() if not t]
        if state_groups and missing:
            lines.append(f"  state groups missing at this node: {missing}")
        elif state_groups:
            lines.append("  state present, but KV before it is incomplete "
                         f"(KV committed up to {hit.shared} tokens only)")
    _story(lines, policy.log.history(node), policy.log.plans(), position)
    return "\n".join(lines)


def explain_log(events: Sequence[ev.Event], block_hashes: Sequence[bytes], position: int,
                block_tokens: int) -> str:
    node = _node_at(block_hashes, position, block_tokens)
    if isinstance(node, str):
        return node
    lines = [f"position {position} (from {len(events)} logged events):"]
    plans = [e for e in events if e.op == ev.PLAN]
    _story(lines, [e for e in events if e.node == node], plans, position)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="why was there no checkpoint at position P")
    ap.add_argument("--events", required=True, help="msgpack file from encode_events")
    ap.add_argument("--hashes", required=True, help="the prompt's block hashes, hex, one a line")
    ap.add_argument("--block-tokens", type=int, required=True)
    ap.add_argument("--position", type=int, required=True)
    args = ap.parse_args(argv)
    with open(args.events, "rb") as f:
        events = ev.decode_events(f.read())
    with open(args.hashes) as f:
        hashes = [bytes.fromhex(line.strip()) for line in f if line.strip()]
    print(explain_log(events, hashes, args.position, args.block_tokens))


if __name__ == "__main__":
    main()
