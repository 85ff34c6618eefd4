#!/usr/bin/env bash
# The main job: replay a bundled agent session on a tiny hybrid model, with and without
# HiStateConnector, and print reused tokens and time to first token side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/agent_demo.py "$@"
