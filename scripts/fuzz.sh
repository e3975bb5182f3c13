#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ and runs each for a while (docs/fuzzing.md).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     default 20; e.g. 5 for CI, 3600 for a long run
#
# Environment:
#   FUZZ_TARGETS    targets to run (default: all of `cargo fuzz list`)
#   FUZZ_TOOLCHAIN  toolchain for cargo-fuzz (default: nightly; libFuzzer's sanitizer flags
#                   need it)
#   FUZZ_JOBS       targets run at once (default 1; each run uses one core)
#   FUZZ_ARGS       extra cargo-fuzz build/run flags, e.g. "--no-default-features" (config
#                   target without the producer/directory/rescheduler crates: faster build)
#
# Needs a nightly toolchain; installs cargo-fuzz when it is missing. Builds once, then runs the
# targets one after the other (FUZZ_JOBS at a time). For each target it prints
# the executions run and "crashes: 0", or the failing input (artifact path, under
# fuzz/artifacts/<target>/) and the tail of libFuzzer's log. Exits non-zero on any crash,
# timeout or out-of-memory, and when a run ends without libFuzzer's final "Done N runs" line;
# exits 2 when the build fails.
#
# Inputs that find new coverage go to fuzz/target/corpus/<target>/ (kept between runs, not
# in git); the seeds in fuzz/corpus/<target>/ are only read. Full logs: fuzz/target/logs/.
set -euo pipefail

secs=${1:-20}
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
    echo "usage: $0 [SECONDS_PER_TARGET]   (a positive integer, default 20)" >&2
    exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tc=${FUZZ_TOOLCHAIN:-nightly}
jobs=${FUZZ_JOBS:-1}
# shellcheck disable=SC2206 # word splitting intended
extra=(${FUZZ_ARGS:-})

if ! cargo "+$tc" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup toolchain install "$tc" --profile minimal
    else
        echo "fuzz: the $tc toolchain is required (rustup toolchain install $tc)" >&2
        exit 2
    fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# Largest input per target (-max_len). The targets also skip anything above 64 KiB.
max_len() {
    case $1 in
        filter) echo 4200 ;;  # a little past MAX_FILTER_LEN (4096) plus value bytes
        pattern) echo 2100 ;; # two raw patterns of up to 1024 bytes and a subject
        config) echo 8192 ;;
        batch) echo 16384 ;;
        event) echo 4096 ;;
        procfs) echo 4096 ;;
        *) echo 4096 ;;
    esac
}

targets=${FUZZ_TARGETS:-$(cargo "+$tc" fuzz list)}
logs=fuzz/target/logs
mkdir -p "$logs"

start=$(date +%s)
echo "fuzz: building ($(cargo "+$tc" --version))"
if ! cargo "+$tc" fuzz build --debug-assertions ${extra[@]+"${extra[@]}"}; then
    echo "fuzz: BUILD FAILED (not a fuzzing result)" >&2
    exit 2
fi
built=$(date +%s)
echo "fuzz: build took $((built - start)) s"
# The targets run from the binaries just built (as `cargo fuzz run` would, minus its rebuild
# check), so a source edit during the run cannot rebuild or break them half way.
triple=$(rustc "+$tc" -vV | sed -n 's/^host: //p')
bindir="fuzz/target/$triple/release"

# Runs one target; writes its one-line summary to $logs/<target>.result.
run_one() {
    local t=$1 work="fuzz/target/corpus/$1" log="$logs/$1.log" rc=0
    mkdir -p "$work" "fuzz/corpus/$t" "fuzz/artifacts/$t"
    "$bindir/$t" -artifact_prefix="fuzz/artifacts/$t/" \
        -max_total_time="$secs" -max_len="$(max_len "$t")" -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 \
        "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
    local done_line
    done_line=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)
    if [ "$rc" -eq 0 ] && [ -n "$done_line" ]; then
        local runs s
        runs=$(awk '{print $2}' <<<"$done_line")
        s=$(awk '{print $5}' <<<"$done_line")
        echo "$t: $runs executions in $s s, crashes: 0" >"$logs/$t.result"
    else
        local artifact
        artifact=$(grep -Eo 'Test unit written to [^ ]+' "$log" | tail -n 1 | awk '{print $NF}' || true)
        echo "$t: FAILED (exit $rc), crashes: 1, artifact: ${artifact:-none (see $log)}" >"$logs/$t.result"
    fi
}

echo "fuzz: running $(wc -w <<<"$targets") targets for $secs s each ($jobs at a time)"
pids=()
for t in $targets; do
    rm -f "$logs/$t.result"
    run_one "$t" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        wait -n || true
    done
done
for p in "${pids[@]}"; do
    wait "$p" || true
done

fail=0
echo "fuzz: results ($(($(date +%s) - built)) s of fuzzing, $(($(date +%s) - start)) s in all)"
for t in $targets; do
    line=$(cat "$logs/$t.result" 2>/dev/null || echo "$t: FAILED, no result")
    echo "  $line"
    case $line in
        *"crashes: 0") ;;
        *)
            fail=1
            echo "---- $t (full log: $logs/$t.log)" >&2
            grep -E -A4 "panicked at" "$logs/$t.log" | head -n 20 >&2 || true
            grep -E "ERROR: libFuzzer|SUMMARY:|Test unit written to|^Base64:" \
                "$logs/$t.log" | head -n 20 >&2 || true
            ;;
    esac
done
if [ "$fail" -ne 0 ]; then
    echo "fuzz: FAILED; reproduce with: $bindir/<target> <artifact>" >&2
    echo "      (or: cargo +$tc fuzz run --debug-assertions ${FUZZ_ARGS:+$FUZZ_ARGS }<target> <artifact>)" >&2
    exit 1
fi
echo "fuzz: ok"
