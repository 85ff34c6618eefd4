"""Who may use a store directory: the engine's user alone.

Every file of the store holds prompts' KV and recurrent states, and its checksums are
not keyed: whoever can read `ssd_dir` reads every prompt, and whoever can write it can
forge entries the engine restores. So the store creates its directories 0700 and its
files 0600 whatever the umask, and refuses a root another user owns or can write.
"""

from __future__ import annotations

import os
import stat

from histate_vllm.store.errors import StoreUnusable

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafeStoreDir(StoreUnusable):
    """The root exists but is not the engine user's alone: nothing in it is trusted."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(
            path,
            f"the directory {why}. The store holds every prompt's KV and is trusted on "
            "restore, so its directory must be owned by this user and writable by no one "
            "else (e.g. `chmod 700`)",
        )


def make_private_dirs(path: str) -> None:
    """Create `path` (parents as usual) with the leaf 0700, umask or not."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return
    os.chmod(path, DIR_MODE)  # a umask can strip owner bits too


def check_root(path: str) -> None:
    """Raise UnsafeStoreDir unless `path` is a real directory of this user that no one
    else can write (OSError if it cannot be examined at all)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(path)  # a configured root may be a link; what it names must pass
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStoreDir(path, "is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeStoreDir(path, f"is owned by uid {st.st_uid}, not this user ({os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStoreDir(path, f"is writable by group or others (mode {st.st_mode & 0o777:o})")


def open_root(path: str) -> None:
    """Create the root if missing (0700) and check it (see `check_root`)."""
    make_private_dirs(path)
    check_root(path)
