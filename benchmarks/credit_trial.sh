#!/usr/bin/env bash
# HiState with checkpoints on credit (the policy option `credit`, off by default) on every
# replay trace_replay_all.sh runs, HiState alone, plus five other shapes of the
# TraceLab-like mix (orders 3 and 4) with the default policy and vLLM 0.34 beside it;
# summarize_credit.py sets credit beside the default policy's runs of the same orders.
#
#   bash benchmarks/credit_trial.sh OUT_DIR [WEKA_DIRS...]
#   python benchmarks/summarize_credit.py OUT_DIR weka=RUNS_weka weka-more=RUNS_weka-more
#
# RUNS_*: trace_replay_all.sh's OUT_DIRs. One stream per folder and one for the rest, on 2
# cores: about 60 minutes for both folders, the synthetic workloads and Mooncake's trace.
set -euo pipefail
out=${1:?OUT_DIR}; shift
dirs=${*:-../shared/traces/weka ../shared/traces/weka-more}
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
mkdir -p "$out"
run() {  # NAME POLICIES ARGS...: one simulation, skipped if its file exists
    local name=$1 policies=$2; shift 2
    [[ -f "$out/$name.json" ]] && return
    "$py" -m trace_replay simulate --jobs 1 --no-progress --policies "$policies" "$@" \
        --json "$out/$name.json.part" >/dev/null
    mv "$out/$name.json.part" "$out/$name.json"
}
sim() { local name=$1; shift; run "$name" histate --histate-option credit=true "$@"; }
mix="output_tokens=233"
synthetic() {
    for s in 0 1 2 3 4 5 6 7; do
        sim "tl-s$s" --synth \
            "mixed:n_sessions=68,turns=70,system_tokens=9216,new_tokens=1116,$mix,forks=0,seed=$s"
    done
    local i=0 shape
    for shape in "n_sessions=40,turns=100,system_tokens=9216,new_tokens=1116,$mix,forks=0" \
                 "n_sessions=96,turns=50,system_tokens=9216,new_tokens=1116,$mix,forks=0" \
                 "n_sessions=68,turns=70,system_tokens=4096,new_tokens=2048,$mix,forks=0" \
                 "n_sessions=68,turns=70,system_tokens=16384,new_tokens=600,$mix,forks=0" \
                 "n_sessions=68,turns=70,system_tokens=9216,new_tokens=1116,$mix,forks=2"; do
        for s in 3 4; do
            sim "shape$i-s$s" --synth "mixed:$shape,seed=$s"
            run "base-shape$i-s$s" \
                histate,vllm034-lru-r4,vllm034-lru-r8,unlimited-host,unlimited \
                --synth "mixed:$shape,seed=$s"
        done
        i=$((i + 1))
    done
    for p in 0 0.02 0.05 0.1; do
        for s in 0 1 2; do sim "mut-p$p-s$s" --synth "mutation:p=$p,seed=$s"; done
    done
    for s in 0 1 2 3 4 5 6 7; do
        sim "mooncake-s$s" ../shared/traces/mooncake/conversation_trace.jsonl --format mooncake \
            --seed "$s"
    done
}
folder() {
    local d=$1 f s
    f=$(basename "$d")
    for s in 0 1 2; do
        sim "$f-raw-s$s" "$d" --format weka --seed "$s" --max-delay none --max-context 0
    done
    for s in 0 1 2 3; do
        sim "$f-paper-s$s" "$d" --format weka --seed "$s"
        sim "$f-shared4-s$s" "$d" --format weka --seed "$s" --concurrent-prefills 4
    done
}
for d in $dirs; do folder "$d" & done
synthetic
wait
