"""Where each file of the store lives, and how its name is parsed back.

    ROOT/<identity digest>/
        identity.json                   the StoreIdentity, for people and fsck
        chunks/<ab>/<key hex>.kv        KV chunk, written once
        states/<ab>/<key hex>.<gen>.st  checkpoint state; <gen> is unique per publish
        manifests/<ab>/<key hex>.mf     checkpoint manifest: its presence publishes it
        quarantine/<ns>.<name>          entries that failed verification
        .../.<name>.<pid>.<token>.tmp   a write in progress (or left by a crash)

`<ab>` is the first byte of the key in hex, so no directory holds more than 1/256 of
the entries. A state file name is unique per publish, so re-publishing a key never
overwrites the file that the current manifest names.
"""

from __future__ import annotations

import os
import secrets
import time

CHUNK_SUFFIX = ".kv"
STATE_SUFFIX = ".st"
MANIFEST_SUFFIX = ".mf"
TMP_SUFFIX = ".tmp"
IDENTITY_FILE = "identity.json"
KIND_DIRS = ("chunks", "states", "manifests")


class Layout:
    def __init__(self, root: str, digest: str) -> None:
        self.root = root
        self.digest = digest
        self.dir = os.path.join(root, digest)
        self.chunks_dir = os.path.join(self.dir, "chunks")
        self.states_dir = os.path.join(self.dir, "states")
        self.manifests_dir = os.path.join(self.dir, "manifests")
        self.quarantine_dir = os.path.join(self.dir, "quarantine")
        self.identity_path = os.path.join(self.dir, IDENTITY_FILE)

    @property
    def top_dirs(self) -> tuple[str, ...]:
        return (self.chunks_dir, self.states_dir, self.manifests_dir, self.quarantine_dir)

    @staticmethod
    def fanout(key: bytes) -> str:
        return key[:1].hex() or "00"

    def chunk_path(self, key: bytes) -> str:
        return os.path.join(self.chunks_dir, self.fanout(key), key.hex() + CHUNK_SUFFIX)

    def manifest_path(self, key: bytes) -> str:
        return os.path.join(self.manifests_dir, self.fanout(key), key.hex() + MANIFEST_SUFFIX)

    def state_dir(self, key: bytes) -> str:
        return os.path.join(self.states_dir, self.fanout(key))

    def state_path(self, key: bytes, state_file: str) -> str:
        # decode_manifest checks names read from disk; this is the last line of defence.
        if "/" in state_file or state_file in ("", ".", ".."):
            raise ValueError(f"not a state file name: {state_file!r}")
        return os.path.join(self.state_dir(key), state_file)


def new_state_file(key: bytes) -> str:
    return f"{key.hex()}.{time.time_ns():x}{secrets.token_hex(2)}{STATE_SUFFIX}"


def tmp_path(final: str) -> str:
    d, name = os.path.split(final)
    return os.path.join(d, f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def tmp_owner_pid(name: str) -> int | None:
    """The pid in a temporary file's name, or None if `name` is not one."""
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return None
    parts = name.split(".")
    try:
        return int(parts[-3])
    except (IndexError, ValueError):
        return None


def key_of(name: str, suffix: str) -> bytes | None:
    """The key a chunk, manifest or state file name encodes, or None if it is not one."""
    if name.startswith(".") or not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if suffix == STATE_SUFFIX:
        stem = stem.rpartition(".")[0]
    try:
        key = bytes.fromhex(stem)
    except ValueError:
        return None
    return key or None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
