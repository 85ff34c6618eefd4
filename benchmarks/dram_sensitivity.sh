#!/usr/bin/env bash
# How much of HiState's distance to Unlimited on the raw replay is host-memory capacity:
# the raw replay of one folder of Weka traces at several DRAM sizes, the SSD unchanged.
#
#   bash benchmarks/dram_sensitivity.sh WEKA_DIR OUT_DIR [RAW_SEEDS]
#   python benchmarks/summarize_dram.py --into benchmarks/results_trace_replay.md \
#       weka=OUT_weka weka-more=OUT_weka-more
#
# Writes OUT_DIR/dram-GGG-sS.json per DRAM size (GiB) and admission order. Policies: HiState,
# the best ablation on the raw replay (fixed-32), vLLM 0.34's native offloading at the
# retention interval best on the raw replay (64 blocks), and Unlimited-host (no capacity
# limit; it does not depend on the size), and histate-oracle (HiState that drops what no later
# request uses: how much of the rest is capacity spent on dead data). Wall time on 2 cores:
# about 8 minutes for weka/, 25 for weka-more/.
set -euo pipefail
weka=${1:?WEKA_DIR}; out=${2:?OUT_DIR}; raw=${3:-3}
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
mkdir -p "$out"
for gib in 96 192 384; do
    for ((s = 0; s < raw; s++)); do
        "$py" -m trace_replay simulate --jobs 2 --no-progress \
            --policies histate,fixed-32,vllm034-lru-r64,unlimited-host,histate-oracle \
            --dram-gib "$gib" \
            "$weka" --format weka --seed "$s" --max-delay none --max-context 0 \
            --json "$out/dram-$gib-s$s.json" >/dev/null
    done
done
