#!/usr/bin/env bash
# The simulated fleet runs behind benchmarks/results_fleet.md ("A fleet tier shared by every
# engine, simulated"): 4 engines, every row on weka/ (3 admission orders) and weka-more/
# (1 order), at the fleet link bandwidth measured by bench_fleet_tier.py (DirBackend on
# local disk, the default), at Mooncake Store's 0.5 GB/s per put/get and at 1.5 GB/s (its
# batch calls' best). One process at a time; about 50 minutes on 2 cores.
#
#   bash benchmarks/sim_fleet.sh OUT_DIR [WEKA_DIR] [WEKA_MORE_DIR]
#   python -m trace_replay fleet --report OUT_DIR/*.json       # the tables again
set -euo pipefail
out=${1:?OUT_DIR}; weka=${2:-../shared/traces/weka}; more=${3:-../shared/traces/weka-more}
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
mkdir -p "$out"
fleet() { "$py" -m trace_replay fleet --format weka "$@"; }
fleet "$weka" --seeds 0,1,2 --json "$out/weka-dir.json"
fleet "$more" --seeds 0 --json "$out/more-dir.json"
for gbps in 0.5 1.5; do
    fleet "$weka" --seeds 0,1,2 --rows load+fleet,load+native --fleet-read-gbps $gbps \
        --fleet-write-gbps $gbps --json "$out/weka-$gbps.json"
done
fleet "$more" --seeds 0 --rows load+fleet,load+native --fleet-read-gbps 0.5 \
    --fleet-write-gbps 0.5 --json "$out/more-0.5.json"
# Consistent hashing with bounded loads, without and with the tier; the tier also at 5 GB/s.
fleet "$weka" --seeds 0,1,2 --rows bounded,bounded+fleet --json "$out/weka-bounded.json"
fleet "$weka" --seeds 0,1,2 --rows bounded+fleet --fleet-read-gbps 5 --fleet-write-gbps 5 \
    --json "$out/weka-bounded-5.json"
fleet "$more" --seeds 0 --rows bounded,bounded+fleet --json "$out/more-bounded.json"
fleet "$more" --seeds 0 --rows bounded+fleet --fleet-read-gbps 5 --fleet-write-gbps 5 \
    --json "$out/more-bounded-5.json"
