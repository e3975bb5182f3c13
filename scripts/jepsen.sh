#!/usr/bin/env bash
# The Jepsen-style directory test, long: GMA_JEPSEN_SECONDS of faults per run (default 600),
# one run per seed (default: 3 random seeds; or give seeds as arguments). Each run prints its
# seed and the command that replays it; the history and fault schedule of every run are kept
# in target/tmp/jepsen/history-<seed>.txt. Needs root (network namespaces) and iproute2.
#
#   scripts/jepsen.sh                 # 3 random seeds, 600 s each
#   GMA_JEPSEN_SECONDS=120 scripts/jepsen.sh 1 2 3
set -euo pipefail
cd "$(dirname "$0")/.."

export GMA_JEPSEN_SECONDS="${GMA_JEPSEN_SECONDS:-600}"
seeds=("$@")
if [ ${#seeds[@]} -eq 0 ]; then
    for _ in 1 2 3; do seeds+=("$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"); done
fi

# Built once; plain `cargo test` runs it (no nextest per-test time limit for long runs).
cargo test -p gma --test jepsen --no-run
failed=()
for seed in "${seeds[@]}"; do
    echo "== seed $seed, ${GMA_JEPSEN_SECONDS} s of faults"
    if ! GMA_JEPSEN_SEED="$seed" cargo test -p gma --test jepsen -- --exact \
        the_directory_stays_linearizable_under_partitions_kills_and_pauses --nocapture; then
        failed+=("$seed")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED seeds: ${failed[*]} (histories in target/tmp/jepsen/)"
    exit 1
fi
echo "all ${#seeds[@]} runs linearizable, nothing acknowledged lost"
