#!/usr/bin/env bash
# Writes producer/gma-agent.order: the functions `gma-agent` runs, most called first, which
# producer/build.rs hands to the linker to place together at the start of the agent's code
# (LLD's --symbol-ordering-file). What the agent runs then lies in about 1 MiB of its 4.6 MiB
# of code, and about 2 MiB fewer of its pages are resident (docs/PERFORMANCE.md, "The agent's
# code in one place").
#
# How: the `agent`-profile gma-agent runs under valgrind's callgrind for SECONDS from the
# bench's start (default 75: start-up, host.bench's and host.info's first runs, a minute of
# ticks) with a subscriber of every event (`gma bench agent`, the release gma); every function
# callgrind saw run that the executable has is listed, ordered by how often it was called (the
# per-tick code together), then by its own instructions.
#
# The names are the `agent` profile's mangled symbols. They change with the toolchain and with
# dependency versions; the linker skips a name it does not find, so a stale file costs only the
# placement, never the build. scripts/build-deb.sh says how many of the names the agent it
# packages still has: run this again when it says fewer than 90 %.
#
#   scripts/agent-order.sh [SECONDS]
#
# Needs valgrind (installed when missing, as scripts/test.sh installs its packages), python3
# and nm (binutils); about 3 minutes after the two release builds.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-75}

if ! command -v callgrind_control >/dev/null; then
    echo "== installing valgrind (Debian package) for callgrind" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends valgrind >/dev/null
fi

cargo build --release --locked -p gma --bin gma >&2
cargo build --profile agent --locked -p gma-producer --bin gma-agent >&2
target_dir=$(realpath "${CARGO_TARGET_DIR:-target}")
agent="$target_dir/agent/gma-agent"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# `gma bench agent` runs an executable named gma-agent: this one runs the agent under callgrind.
cat >"$work/gma-agent" <<WRAP
#!/bin/sh
exec valgrind --tool=callgrind --demangle=no --log-file=$work/valgrind.log \
    --callgrind-out-file=$work/callgrind.out "$agent" "\$@"
WRAP
chmod +x "$work/gma-agent"

echo "== gma-agent under callgrind for $secs s, with a subscriber of every event" >&2
"$target_dir/release/gma" bench agent --duration $((secs + 30)) --agent-bin "$work/gma-agent" \
    --output json >"$work/bench.json" 2>"$work/bench.log" &
bench=$!
# The profile's window: callgrind writes its counts when told (the bench kills the agent).
sleep "$secs"
pid=$(pgrep -f -- "--callgrind-out-file=$work/callgrind.out" | head -1 || true)
if [ -z "$pid" ]; then
    echo "agent-order: the agent under callgrind is not running; bench log:" >&2
    cat "$work/bench.log" "$work/valgrind.log" >&2 || true
    exit 1
fi
callgrind_control -d "$pid" >/dev/null 2>&1
wait "$bench" || true
dump=$(ls "$work"/callgrind.out.* 2>/dev/null | head -1)
if [ -z "$dump" ] || [ ! -s "$dump" ]; then
    echo "agent-order: callgrind wrote no counts" >&2
    exit 1
fi

nm --defined-only "$agent" | python3 -c '
import collections, re, sys
dump, out = sys.argv[1], sys.argv[2]
have = {p[2] for p in (l.split() for l in sys.stdin) if len(p) == 3 and p[1] in "tTwW"}
names, calls, own = {}, collections.Counter(), collections.Counter()
fn = callee = None
for line in open(dump):
    m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
    if m:
        kind, ident, name = m.groups()
        if name:
            names[ident] = name
        if kind == "fn":
            fn, callee = ident, None
        else:
            callee = ident
        continue
    if line.startswith("calls=") and callee:
        calls[callee] += int(line.split()[0][6:])
        continue
    parts = line.split()
    if fn and len(parts) >= 2 and parts[0][:1] in "0123456789+-*":
        if callee:
            callee = None  # the cost line of a call is the callee inclusive: not this one
        else:
            own[fn] += int(parts[1])
run = [i for i, n in names.items() if n in have and (calls[i] or own[i])]
run.sort(key=lambda i: (-calls[i], -own[i], names[i]))
with open(out, "w") as f:
    f.write("# The functions gma-agent runs, most called first (scripts/agent-order.sh wrote it;\n")
    f.write("# producer/build.rs gives it to the linker). Not to be edited by hand.\n")
    for i in run:
        f.write(names[i] + "\n")
print(f"agent-order: {len(run)} functions of {len(have)} in producer/gma-agent.order", file=sys.stderr)
' "$dump" producer/gma-agent.order
