"""fsck: verify every payload of a store on disk; with --repair, remove what is unusable.

    python -m histate_vllm.store fsck DIR [--json] [--repair] [--grace SECONDS]

DIR is a store root (one subdirectory per identity) or one identity directory. Unlike
the start-up scan, fsck reads and checksums every state and every referenced chunk.
It reports checkpoints ok, bad (would be quarantined), already quarantined, skipped
manifests, and orphans. --repair deletes bad checkpoints and chunks, orphans older
than --grace (default 0: run it with the server stopped, or pass a grace period),
unusable manifests and the quarantine. Exit status 0 when the store is clean (or was
repaired), 1 when problems remain, 2 on a usage error.

What a stop mid-write leaves (temporary files, chunks and state files no manifest names
yet: vLLM ends the engine without waiting for the store's writes) is reported as
leftovers, not problems: nothing refers to them, the next start removes them, and the
store is as good as after a clean shutdown. Other orphans (unknown files, unusable
manifests, files that are not regular files) are problems.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import msgspec

from histate_vllm.store import gc
from histate_vllm.store.fileio import remove_quietly
from histate_vllm.store.format import Kind, StoreIdentity
from histate_vllm.store.layout import IDENTITY_FILE, Layout
from histate_vllm.store.quarantine import iter_manifests
from histate_vllm.store.reader import BadEntry, Expect, peek_header, verify_stream
from histate_vllm.store.scan import read_identity, scan_with_manifests

# Orphan reasons (scan) of what a stop in the middle of a write leaves behind.
LEFTOVER_REASONS = frozenset(
    {"temporary file", "chunk no manifest names", "state file no manifest names"}
)


def _identity_of(ident_dir: str) -> StoreIdentity | None:
    """The identity a directory holds: identity.json, else any manifest that fits."""
    digest = os.path.basename(os.path.normpath(ident_dir))
    ident = read_identity(ident_dir)
    if ident is not None and ident.digest() == digest:
        return ident
    layout = Layout(os.path.dirname(os.path.normpath(ident_dir)), digest)
    for _, m in iter_manifests(layout):
        if m.identity.digest() == digest:
            return m.identity
    return None


def _store_dirs(path: str) -> list[str]:
    if os.path.exists(os.path.join(path, IDENTITY_FILE)) or os.path.isdir(
        os.path.join(path, "manifests")
    ):
        return [path]
    try:  # the store makes no symlinks: never follow one (a loop, or out of the store)
        subs = sorted(e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []
    return [d for d in subs if _store_dirs(d) == [d]]


def _verify_chunks(layout: Layout, manifests, digest: str) -> dict[bytes, str]:
    """Verify every referenced chunk once; return {key: reason} of the bad ones."""
    bad: dict[bytes, str] = {}
    seen: set[bytes] = set()
    for m in manifests.values():
        for ck in m.chunk_keys:
            if ck in seen:
                continue
            seen.add(ck)
            try:
                verify_stream(layout.chunk_path(ck), ck, Kind.CHUNK, digest)
            except (BadEntry, OSError) as e:
                bad[ck] = str(e)
    return bad


def fsck_store(ident_dir: str, *, repair: bool, grace_s: float) -> dict:
    ident_dir = os.path.normpath(ident_dir)
    digest = os.path.basename(ident_dir)
    report: dict = {"dir": ident_dir, "identity": None, "problems": []}
    identity = _identity_of(ident_dir)
    if identity is None:
        report["problems"].append("identity unknown: no identity.json or manifest fits")
        return report
    report["identity"] = msgspec.to_builtins(identity)
    layout = Layout(os.path.dirname(ident_dir), digest)
    index, manifests = scan_with_manifests(layout, identity, log=False)
    bad_chunks = _verify_chunks(layout, manifests, digest)
    bad: dict[bytes, str] = {}
    for key, m in manifests.items():
        for ref in m.chunk_refs():
            if ref.key in bad_chunks:
                bad[key] = f"chunk {ref.key.hex()[:16]}… corrupt: {bad_chunks[ref.key]}"
                break
            try:
                h = peek_header(layout.chunk_path(ref.key))
            except (BadEntry, OSError):
                h = None
            if h is None or (h[0].nbytes, h[0].checksum) != (ref.nbytes, ref.checksum):
                bad[key] = f"chunk {ref.key.hex()[:16]}… differs from the manifest"
                break
        if key in bad:
            continue
        try:
            expect = Expect(m.state_nbytes, m.state_checksum, m.state_algo)
            verify_stream(layout.state_path(key, m.state_file), key, Kind.STATE, digest, expect)
        except (BadEntry, OSError) as e:
            bad[key] = f"state: {e}"
    try:
        quarantined = sorted(os.listdir(layout.quarantine_dir))
    except FileNotFoundError:
        quarantined = []
    report.update(
        checkpoints_ok=len(manifests) - len(bad),
        checkpoints_bad=[{"key": k.hex(), "reason": r} for k, r in bad.items()],
        chunks_ok=len(index.chunks) - len(bad_chunks),
        chunks_bad=[{"key": k.hex(), "reason": r} for k, r in bad_chunks.items()],
        skipped=[{"path": p, "reason": r} for p, r in index.skipped],
        orphans=[{"path": o.path, "bytes": o.nbytes, "reason": o.reason,
                  "leftover": o.reason in LEFTOVER_REASONS} for o in index.orphans],
        quarantined=len(quarantined),
        usage_bytes=gc.usage_bytes(layout),
    )
    if repair:
        removed = 0
        for key, m in manifests.items():
            if key in bad:
                removed += remove_quietly(layout.manifest_path(key))
                removed += remove_quietly(layout.state_path(key, m.state_file))
        for key in bad_chunks:
            removed += remove_quietly(layout.chunk_path(key))
        for name in quarantined:
            removed += remove_quietly(os.path.join(layout.quarantine_dir, name))
        # A fresh pass picks up what the removals above orphaned.
        g = gc.collect_garbage(layout, identity, grace_s=grace_s, quarantine_keep=0)
        report["repaired"] = {"removed_files": removed + len(g.removed), "errors": g.errors}
        report["usage_bytes_after"] = gc.usage_bytes(layout)
    return report


def is_clean(r: dict) -> bool:
    if r["problems"]:
        return False
    if "repaired" in r:
        return not r["repaired"]["errors"]
    problems = [o for o in r["orphans"] if not o["leftover"]]
    return not (r["checkpoints_bad"] or r["chunks_bad"] or r["skipped"] or problems)


def _print_text(r: dict) -> None:
    print(f"store {r['dir']}")
    if r["identity"] is None:
        for p in r["problems"]:
            print(f"  PROBLEM: {p}")
        return
    ident = r["identity"]
    print(
        f"  identity: model={ident['model']} dtype={ident['dtype']} "
        f"tp={ident['tp_rank']}/{ident['tp_size']} vllm={ident['vllm_version']}"
    )
    print(
        f"  checkpoints ok: {r['checkpoints_ok']}  bad: {len(r['checkpoints_bad'])}  "
        f"quarantined: {r['quarantined']}  skipped manifests: {len(r['skipped'])}"
    )
    orphan_bytes = sum(o["bytes"] for o in r["orphans"])
    print(
        f"  chunks ok: {r['chunks_ok']}  bad: {len(r['chunks_bad'])}  "
        f"orphans: {len(r['orphans'])} ({orphan_bytes} bytes)  usage: {r['usage_bytes']}"
    )
    for item in r["checkpoints_bad"] + r["chunks_bad"]:
        print(f"  bad {item['key'][:16]}…: {item['reason']}")
    for item in r["skipped"]:
        print(f"  skipped {item['path']}: {item['reason']}")
    leftovers = [o for o in r["orphans"] if o["leftover"]]
    for item in [o for o in r["orphans"] if not o["leftover"]][:20]:
        print(f"  orphan {item['path']}: {item['reason']}")
    if leftovers:
        print(f"  leftovers of interrupted writes: {len(leftovers)} file(s), "
              f"{sum(o['bytes'] for o in leftovers)} bytes (a stop mid-write leaves these; "
              "no entry uses them; the next start or --repair removes them)")
    if "repaired" in r:
        print(
            f"  repaired: removed {r['repaired']['removed_files']} file(s), "
            f"usage now {r['usage_bytes_after']}"
        )


def main(argv: list[str] | None = None) -> int:
    """`python -m histate_vllm.store fsck DIR ...`; the word `fsck` is optional, so the
    `histate-fsck DIR ...` console script shares this entry point."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["fsck"]:
        args_in = args_in[1:]
    parser = argparse.ArgumentParser(
        prog="python -m histate_vllm.store fsck",
        description="Verify a histate SSD store; --repair removes what is unusable.",
    )
    parser.add_argument("dir", help="store root, or one identity directory in it")
    parser.add_argument("--json", action="store_true", help="print one JSON report")
    parser.add_argument("--repair", action="store_true", help="remove what cannot be used")
    parser.add_argument(
        "--grace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --repair, keep orphans younger than this (default 0)",
    )
    args = parser.parse_args(args_in)
    if not os.path.isdir(args.dir):
        print(f"fsck: {args.dir}: not a directory", file=sys.stderr)
        return 2
    dirs = _store_dirs(args.dir)
    if not dirs:
        print(f"fsck: {args.dir}: no store found", file=sys.stderr)
        return 2
    try:
        reports = [fsck_store(d, repair=args.repair, grace_s=args.grace) for d in dirs]
    except OSError as e:  # whatever is on disk: a message and an exit status, no traceback
        print(f"fsck: {args.dir}: {e}", file=sys.stderr)
        return 1
    ok = all(is_clean(r) for r in reports)
    if args.json:
        print(json.dumps({"ok": ok, "stores": reports}, indent=2))
    else:
        for r in reports:
            _print_text(r)
        print("clean" if ok else "problems found")
    return 0 if ok else 1
