"""`python -m histate_vllm inspect DIR [why PROMPT_FILE]`: what the cache holds, and why a
prompt hit or missed.

DIR is the connector's `ssd_dir` (every store identity in it), one identity directory, or an
event-log directory (`event_log_dir`). The table lists checkpoints per session (a session is
the deepest checkpoint's chain; shallower checkpoints on it belong to it): position, tier
(ssd from the store; dram from the event log), size on disk, last use and the policy's last
GDS score (from the event log; "-" when none was logged).

`why PROMPT_FILE` finds the logged request whose prompt matches PROMPT_FILE's longest, and
prints what vLLM resumed from, the miss cause if any, and the events of the blocks past it.
PROMPT_FILE: a JSON list of token ids, or {"prompt_token_ids": [...]}; with --tokenizer
MODEL also plain text, {"prompt": "..."} or {"messages": [...]} (the chat template applied).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from histate_vllm.bookkeeping.eventlog import (
    LOG_NAME,
    Lookup,
    fingerprints,
    read_log,
    scope_seed,
)
from histate_vllm.policy import events as ev
from histate_vllm.policy.explain import _fmt
from histate_vllm.store.fsck import _identity_of, _store_dirs
from histate_vllm.store.layout import Layout
from histate_vllm.store.scan import scan

_GONE = (ev.EVICT, ev.DEMOTE, ev.REMOVE, ev.FAIL)


def _log_dir(path: str) -> str | None:
    for d in (path, os.path.join(path, "events")):
        if os.path.exists(os.path.join(d, LOG_NAME)) or os.path.exists(
                os.path.join(d, LOG_NAME + ".1")):
            return d
    return None


def _when(t: float | None) -> str:
    return "-" if not t else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _dram_states(events: Sequence[ev.Event]) -> dict[bytes, ev.Event]:
    """State keys whose DRAM copy the log shows admitted and not dropped since."""
    live: dict[bytes, ev.Event] = {}
    for e in events:
        if e.kind is None or e.kind.name != "STATE" or e.tier is None or e.tier.name != "DRAM":
            continue
        if e.op in (ev.ADMIT, ev.RESTORE):
            live[e.key] = e
        elif e.op in _GONE:
            live.pop(e.key, None)
    return live


def fleet_rows(fleet_dir: str, ident) -> list[dict]:
    """Rows (tier "fleet") for the checkpoints a fleet directory holds under `ident`."""
    from histate_vllm.store.fleet import objects
    from histate_vllm.store.format import FormatError, decode_manifest

    rows = []
    mf = os.path.join(fleet_dir, objects.prefix(ident), "mf")
    for name in sorted(os.listdir(mf)) if os.path.isdir(mf) else ():
        path = os.path.join(mf, name)
        try:
            m = decode_manifest(open(path, "rb").read())
            mtime = os.stat(path).st_mtime
        except (OSError, FormatError):
            continue  # being replaced, or damaged: a restore would refuse it too
        if m.identity != ident:
            continue
        rows.append(dict(key=m.key, node=m.key[:-4], position=m.position, tier="fleet",
                         size=m.state_nbytes + sum(m.chunk_nbytes), last_use=mtime,
                         score=None, request=m.provenance))
    return rows


def checkpoint_rows(ident_dir: str, events: Sequence[ev.Event],
                    lookups: Sequence[Lookup] = (), fleet_dir: str | None = None
                    ) -> list[dict]:
    """One row per checkpoint of the store (and DRAM ones from the log, and the fleet
    directory's of the same identity), by session."""
    ident = _identity_of(ident_dir)
    rows: list[dict] = []
    last_use: dict[bytes, float] = {}
    score: dict[bytes, float] = {}
    for e in events:
        if e.node:
            last_use[e.node] = e.t if e.op in (ev.HIT, ev.ADMIT, ev.RESTORE) else \
                last_use.get(e.node, 0.0)
            if e.score is not None:
                score[e.node] = e.score
    # Event clocks are the policy's (monotonic); map them to wall time by the newest event.
    shift = time.time() - max((e.t for e in events), default=0.0) if events else 0.0
    # Prompt chains: the store's manifests, and the prompts the log looked up.
    chains: dict[bytes, list[bytes]] = {lk.nodes[-1]: list(lk.nodes) for lk in lookups
                                        if lk.nodes}
    if ident is not None:
        root = os.path.dirname(os.path.normpath(ident_dir))
        index = scan(Layout(root, ident.digest()), ident, log=False)
        for key, info in index.checkpoints.items():
            node = key[:-4]
            chains[node] = [k[:-4] for k in info.chunk_keys] + [node]
            rows.append(dict(key=key, node=node, position=info.position, tier="ssd",
                             size=info.nbytes, last_use=info.mtime,
                             score=score.get(node), request=info.provenance))
    if fleet_dir is not None and ident is not None:
        for r in fleet_rows(fleet_dir, ident):
            chains.setdefault(r["node"], [r["node"]])
            rows.append(r)
    for key, e in _dram_states(events).items():
        rows.append(dict(key=key, node=e.node, position=e.position, tier="dram", size=None,
                         last_use=None, score=score.get(e.node), request=e.request_id))
    for r in rows:
        if r["node"] in last_use and last_use[r["node"]]:
            r["last_use"] = max(r["last_use"] or 0.0, last_use[r["node"]] + shift)
    # Sessions: the deepest chain through each checkpoint (first seen wins a shared prefix).
    owner: dict[bytes, bytes] = {}
    for leaf, chain in sorted(chains.items(), key=lambda kv: -len(kv[1])):
        for n in chain:
            owner.setdefault(n, leaf)
    # A checkpoint is one state per state group: one row per (checkpoint, tier).
    merged: dict[tuple[bytes, str], dict] = {}
    for r in rows:
        m = merged.setdefault((r["node"], r["tier"]), r)
        if m is not r and r["size"] is not None:
            m["size"] = (m["size"] or 0) + r["size"]
    rows = list(merged.values())
    for r in rows:
        r["session"] = owner.get(r["node"], r["node"]).hex()[:12]
    rows.sort(key=lambda r: (r["session"], r["position"], r["tier"]))
    return rows


def print_table(rows: list[dict], title: str, console: Console) -> None:
    table = Table(title=title)
    for col in ("session", "position", "tier", "size", "last use", "score", "written by"):
        table.add_column(col, justify="right" if col in ("position", "size", "score") else "left")
    for r in rows:
        table.add_row(r["session"], str(r["position"]), r["tier"],
                      "-" if r["size"] is None else f"{r['size']:,}", _when(r["last_use"]),
                      "-" if r["score"] is None else f"{r['score']:.3f}", r["request"] or "-")
    console.print(table)


def _token_ids(ids) -> list[int]:
    """Token ids as given in a prompt file, or SystemExit saying what is wrong."""
    if not isinstance(ids, list) or not all(
        type(x) is int and 0 <= x < 1 << 63 for x in ids  # noqa: E721 - bool is no token
    ):
        raise SystemExit("inspect why: prompt_token_ids must be a list of token ids "
                         "(integers from 0 to 2**63-1)")
    return ids


def read_prompt(path: str, tokenizer: str | None) -> list[int]:
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = text
    if isinstance(data, list) and all(isinstance(x, int) for x in data):
        return _token_ids(data)
    if isinstance(data, dict) and "prompt_token_ids" in data:
        return _token_ids(data["prompt_token_ids"])
    if tokenizer is None:
        raise SystemExit("inspect why: a text or chat prompt needs --tokenizer MODEL")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    if isinstance(data, dict) and "messages" in data:
        return list(tok.apply_chat_template(data["messages"], add_generation_prompt=True,
                                            tokenize=True))
    prompt = data["prompt"] if isinstance(data, dict) else str(data)
    return tok.encode(prompt)


def _matched(lookup: Lookup, fps_by_bt: dict[int, list[int]]) -> int:
    fps = fps_by_bt[lookup.block_tokens]
    n = 0
    for a, b in zip(lookup.fps, fps):
        if a != b:
            break
        n += 1
    return n


def why(token_ids: list[int], events: Sequence[ev.Event], lookups: Sequence[Lookup],
        seed: int = 0) -> str:
    """seed: `scope_seed` of the prompt's cache_salt and LoRA adapter; only requests of
    the same salt and adapter can match."""
    lookups = [lk for lk in lookups if lk.block_tokens > 0]  # a torn or foreign record
    if not lookups:
        return "no lookups in the event log"
    fps_by_bt = {bt: fingerprints(token_ids, bt, seed=seed)
                 for bt in {lk.block_tokens for lk in lookups}}
    best = max(lookups, key=lambda lk: (_matched(lk, fps_by_bt), lk.t))
    bt, nblocks = best.block_tokens, _matched(best, fps_by_bt)
    if nblocks == 0:
        return ("no logged request shares a whole block with this prompt "
                f"({len(token_ids)} tokens, {bt}-token blocks): nothing could be reused")
    lines = [f"closest logged request: {best.request_id} at {_when(best.t)}; its first "
             f"{nblocks * bt} tokens equal this prompt's ({len(token_ids)} tokens)",
             f"  vLLM resumed from {best.covered} of {best.prompt_tokens} tokens: "
             f"{best.gpu} from the GPU prefix cache, {best.covered - best.gpu} from HiState",
             f"  HiState then held KV for {best.shared} tokens; deepest checkpoint at "
             f"{best.position}"]
    if best.covered > best.gpu:
        lines.append(f"  HIT: {best.covered - best.gpu} tokens restored by HiState")
    if best.cause:
        lines.append(f"  MISS ({best.cause}): {best.missed} more tokens could have been "
                     "reused")
    elif best.covered <= best.gpu:
        lines.append("  nothing cached past what it resumed from (not a miss)")
    nodes = best.nodes[: nblocks]
    past = [(i + 1) * bt for i in range(best.covered // bt, len(nodes))]
    shown = 0
    for pos in reversed(past):
        node = nodes[pos // bt - 1]
        hist = [e for e in events if e.node == node]
        if hist:
            lines.append(f"  events at position {pos}:")
            lines.extend("    " + _fmt(e) for e in hist[-8:])
            shown += 1
            if shown == 2:
                break
    if not shown and past:
        lines.append("  no event was logged for the blocks past that point")
    later = [lk for lk in lookups if lk.t > best.t and _matched(lk, fps_by_bt) >= nblocks]
    if later:
        lines.append(f"  (the prompt was seen again {len(later)} time(s) later)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except OSError as e:  # whatever is on disk or given: a message and a status, no traceback
        print(f"inspect: {e}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m histate_vllm inspect",
                                 description="Show a HiState store and event log.")
    ap.add_argument("dir", help="ssd_dir, an identity directory in it, or an event-log dir")
    ap.add_argument("why", nargs="?", choices=["why"], help="explain a prompt's hit or miss")
    ap.add_argument("prompt_file", nargs="?")
    ap.add_argument("--fleet-dir", help="a fleet tier's shared directory (fleet_dir): its "
                    "checkpoints of the same identity are listed as tier \"fleet\"")
    ap.add_argument("--tokenizer", help="model or tokenizer for a text/chat PROMPT_FILE")
    ap.add_argument("--cache-salt", help="the prompt's cache_salt (only requests with the "
                    "same salt are compared)")
    ap.add_argument("--lora-name", help="the prompt's LoRA adapter name (likewise)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"inspect: {args.dir}: not a directory", file=sys.stderr)
        return 2
    console = Console(width=140)
    stores = _store_dirs(args.dir)
    log_dirs = [d for d in (_log_dir(s) for s in stores) if d] or \
        [d for d in [_log_dir(args.dir)] if d]
    events: list[ev.Event] = []
    lookups: list[Lookup] = []
    for d in log_dirs:
        e, lk = read_log(d)
        events += e
        lookups += lk
    if args.why:
        if not args.prompt_file:
            ap.error("why needs PROMPT_FILE")
        seed = scope_seed(args.cache_salt, args.lora_name)
        print(why(read_prompt(args.prompt_file, args.tokenizer), events, lookups, seed))
        return 0
    if not stores and not log_dirs:
        print(f"inspect: {args.dir}: no store and no event log found", file=sys.stderr)
        return 2
    for s in stores or [args.dir]:
        own = _log_dir(s)
        ev_s = read_log(own)[0] if own else (events if not stores else [])
        rows = checkpoint_rows(s, ev_s, lookups, args.fleet_dir)
        print_table(rows, f"{s}: {len(rows)} checkpoints", console)
    if lookups:
        misses = [lk for lk in lookups if lk.cause]
        console.print(f"event log: {len(events)} events, {len(lookups)} lookups, "
                      f"{len(misses)} misses" + (" (" + ", ".join(
                          f"{c}={sum(lk.cause == c for lk in misses)}"
                          for c in sorted({lk.cause for lk in misses})) + ")" if misses else ""))
    return 0
