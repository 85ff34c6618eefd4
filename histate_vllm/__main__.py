"""`python -m histate_vllm inspect DIR [why PROMPT_FILE]` (see
histate_vllm.bookkeeping.log_inspect); `python -m histate_vllm fsck DIR` (see
histate_vllm.store.fsck)."""

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["inspect"]:
        from histate_vllm.bookkeeping.log_inspect import main as inspect_main

        return inspect_main(args[1:])
    if args[:1] == ["fsck"]:
        from histate_vllm.store.fsck import main as fsck_main

        return fsck_main(args[1:])
    print("usage: python -m histate_vllm {inspect DIR [why PROMPT_FILE] | fsck DIR}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
