"""`python -m histate_vllm.store fsck DIR [--json] [--repair]` (see `fsck`)."""

import sys

from histate_vllm.store.fsck import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
