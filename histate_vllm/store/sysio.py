"""The seam every system call of a store write path goes through.

Fault-injection tests patch these attributes (ENOSPC, EACCES, a kill at the n-th
call) instead of the `os` module, so nothing else in the process is affected.
"""

import os
from types import SimpleNamespace

SYS = SimpleNamespace(
    open=os.open,
    write=os.write,
    writev=os.writev,
    fsync=os.fsync,
    ftruncate=os.ftruncate,
    close=os.close,
    rename=os.rename,
    unlink=os.unlink,
    mkdir=os.mkdir,
)
