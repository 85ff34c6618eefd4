#!/usr/bin/env bash
# Every simulated run behind benchmarks/results_trace_replay.md, then its tables.
#
#   bash benchmarks/trace_replay_all.sh WEKA_DIR OUT_DIR [PAPER_SEEDS] [RAW_SEEDS]
#
# WEKA_DIR: a folder of Weka traces (../shared/traces/weka, or any other set: nothing here
# is tuned to particular traces). Seeds are admission orders 0..N-1 (defaults 10 and 5).
# Wall time on a 2-core machine: about 1 minute per Weka run, 40 minutes in all.
set -euo pipefail
weka=${1:?WEKA_DIR}; out=${2:?OUT_DIR}; paper=${3:-10}; raw=${4:-5}
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
mkdir -p "$out"
sim() { "$py" -m trace_replay simulate --jobs 1 --no-progress "$@" >/dev/null; }
for ((s = 0; s < paper; s++)); do
    sim "$weka" --format weka --seed "$s" --json "$out/weka-paper-s$s.json"
done
# The same with vLLM's long_prefill_token_threshold set so 4 prefills advance together.
for ((s = 0; s < paper; s++)); do
    sim "$weka" --format weka --seed "$s" --concurrent-prefills 4 \
        --json "$out/weka-shared4-s$s.json"
done
for ((s = 0; s < raw; s++)); do
    sim "$weka" --format weka --seed "$s" --max-delay none --max-context 0 \
        --json "$out/weka-raw-s$s.json"
done
for p in 0 0.02 0.05 0.1; do
    for s in 0 1 2 3 4; do
        sim --synth "mutation:p=$p,seed=$s" --json "$out/mut-p$p-s$s.json"
    done
done
for s in 0 1 2; do
    sim --json "$out/tl-s$s.json" --synth \
        "mixed:n_sessions=68,turns=70,system_tokens=9216,new_tokens=1116,output_tokens=233,forks=0,seed=$s"
done
"$py" benchmarks/summarize_trace_replay.py "$out" > "$out/tables.md"
echo "tables: $out/tables.md"
