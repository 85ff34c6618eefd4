#!/usr/bin/env bash
# HiState, its ablations and Unlimited beside vLLM 0.34's own hybrid offloading at every
# swept setting (eviction x prefix_cache_retention_interval), on one folder of Weka traces.
#
#   bash benchmarks/native_sweep.sh WEKA_DIR OUT_DIR [PAPER_SEEDS] [RAW_SEEDS]
#
# Then: python benchmarks/summarize_trace_replay.py OUT_DIR (its "native offloading" tables).
set -euo pipefail
weka=${1:?WEKA_DIR}; out=${2:?OUT_DIR}; paper=${3:-4}; raw=${4:-3}
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
mkdir -p "$out"
native=$("$py" -c "from trace_replay.policies import NATIVE; print(','.join(NATIVE))")
pols="histate,unlimited,align,fixed-32,lru-disk,histate-mirror,vllm-disk,$native"
sim() { "$py" -m trace_replay simulate --jobs 2 --no-progress --policies "$pols" "$@" >/dev/null; }
for ((s = 0; s < paper; s++)); do
    sim "$weka" --format weka --seed "$s" --json "$out/weka-paper-s$s.json"
    sim "$weka" --format weka --seed "$s" --concurrent-prefills 4 --json "$out/weka-shared4-s$s.json"
done
for ((s = 0; s < raw; s++)); do
    sim "$weka" --format weka --seed "$s" --max-delay none --max-context 0 \
        --json "$out/weka-raw-s$s.json"
done
