#!/usr/bin/env bash
# Every simulated run behind benchmarks/results_trace_replay.md, for one folder of Weka traces.
#
#   bash benchmarks/trace_replay_all.sh WEKA_DIR OUT_DIR [PAPER_SEEDS] [RAW_SEEDS]
#   python benchmarks/summarize_trace_replay.py OUT_DIR          # its tables
#
# WEKA_DIR: ../shared/traces/weka (tuned on), ../shared/traces/weka-more (held out) or any
# other set: nothing here is tuned to particular traces. Seeds are admission orders 0..N-1
# (defaults 4 and 3). Every policy runs on every replay: HiState, its ablations, the
# baselines, vLLM 0.34's native offloading at every swept setting, Unlimited and
# Unlimited-host (the limit of any offloading cache); then the replay's noise. SYNTH=0 skips
# the runs that do not depend on WEKA_DIR: the synthetic workloads (mutation microbenchmark,
# TraceLab-like) and Mooncake's conversation trace. Wall time on 2 cores: about 15 minutes
# for weka/ (55 sessions), 55 for weka-more/ (157), 15 for the synthetic workloads and 30
# for Mooncake's trace.
set -euo pipefail
weka=${1:?WEKA_DIR}; out=${2:?OUT_DIR}; paper=${3:-4}; raw=${4:-3}
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
mkdir -p "$out"
sim() { "$py" -m trace_replay simulate --jobs 2 --no-progress --policies all "$@" >/dev/null; }
for ((s = 0; s < paper; s++)); do
    sim "$weka" --format weka --seed "$s" --json "$out/weka-paper-s$s.json"
    # vLLM's long_prefill_token_threshold set so 4 prefills advance together.
    sim "$weka" --format weka --seed "$s" --concurrent-prefills 4 \
        --json "$out/weka-shared4-s$s.json"
done
for ((s = 0; s < raw; s++)); do
    sim "$weka" --format weka --seed "$s" --max-delay none --max-context 0 \
        --json "$out/weka-raw-s$s.json"
done
# The replay's own noise: the same orders with the GPU 0.02% faster (--mfu 0.5001 for 0.5),
# a change no policy decision sees; how far each order's numbers move is the noise floor.
jitter="histate,align,fixed-32,unlimited-host,unlimited"
for ((s = 0; s < paper; s++)); do
    "$py" -m trace_replay simulate --jobs 2 --no-progress --policies "$jitter" --mfu 0.5001 \
        "$weka" --format weka --seed "$s" --json "$out/jitter-paper-s$s.json" >/dev/null
done
for ((s = 0; s < raw; s++)); do
    "$py" -m trace_replay simulate --jobs 2 --no-progress --policies "$jitter" --mfu 0.5001 \
        "$weka" --format weka --seed "$s" --max-delay none --max-context 0 \
        --json "$out/jitter-raw-s$s.json" >/dev/null
done
if [[ ${SYNTH:-1} != 0 ]]; then
    for p in 0 0.02 0.05 0.1; do
        for s in 0 1 2; do
            sim --synth "mutation:p=$p,seed=$s" --json "$out/mut-p$p-s$s.json"
        done
    done
    # 8 orders each of the TraceLab-like mix (seeds 0-2 are what the policy was tuned on,
    # 3-7 are not) and of Mooncake's conversation trace (sessions inferred from prefix chains).
    for s in 0 1 2 3 4 5 6 7; do
        sim --json "$out/tl-s$s.json" --synth \
            "mixed:n_sessions=68,turns=70,system_tokens=9216,new_tokens=1116,output_tokens=233,forks=0,seed=$s"
        sim ../shared/traces/mooncake/conversation_trace.jsonl --format mooncake --seed "$s" \
            --json "$out/mooncake-s$s.json"
    done
fi
"$py" benchmarks/summarize_trace_replay.py "$out" > "$out/tables.md"
echo "tables: $out/tables.md"
