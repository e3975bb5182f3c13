#!/usr/bin/env bash
# Figures of docs/netprobe.md: what network probing costs each host at the default settings
# (CPU of one core, bytes per second on the host's link and in probe payload), then the
# measurement error on a link shaped with tbf. Four hosts, each a network namespace with a veth
# into a bridge; the directory runs in the root namespace on the bridge. Needs root, iproute2
# tc and jq; everything it makes is removed on exit.
#
#   GMA=target/release/gma SECS=60 SHAPED_SECS=90 RATE_MBIT=20 scripts/netprobe-figures.sh
set -euo pipefail
cd "$(dirname "$0")/.."

GMA=${GMA:-target/release/gma}
SECS=${SECS:-60}
SHAPED_SECS=${SHAPED_SECS:-90}
RATE_MBIT=${RATE_MBIT:-20}
N=4
tag=f$$
command -v jq >/dev/null || { echo "jq is needed" >&2; exit 1; }
work=$(mktemp -d)
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for i in $(seq 0 $((N - 1))); do
        ip link del "g${tag}h$i" 2>/dev/null || true
        ip netns del "gma-fig-$tag-$i" 2>/dev/null || true
    done
    ip link del "g${tag}b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A /24 of 10.251.0.0/16 no address or route of this machine uses.
x=$(( $$ % 250 ))
while ip -4 route show | grep -q "^10\.251\.$x\."; do x=$(( (x + 1) % 250 )); done
net=10.251.$x

ip link add "g${tag}b" type bridge
ip addr add "$net.1/24" dev "g${tag}b"
ip link set "g${tag}b" up
for i in $(seq 0 $((N - 1))); do
    ns=gma-fig-$tag-$i
    ip netns add "$ns"
    ip link add "g${tag}h$i" type veth peer name "g${tag}v$i"
    ip link set "g${tag}v$i" netns "$ns"
    ip link set "g${tag}h$i" master "g${tag}b"
    ip link set "g${tag}h$i" up
    ip netns exec "$ns" ip addr add "$net.$((10 + i))/24" dev "g${tag}v$i"
    ip netns exec "$ns" ip link set "g${tag}v$i" up
    ip netns exec "$ns" ip link set lo up
done

# Waits for "<marker> ADDR" in a log and prints ADDR.
addr_of() {
    for _ in $(seq 1 200); do
        if a=$(grep -o "$2 .*" "$1" 2>/dev/null | head -1 | awk '{print $NF}') && [ -n "$a" ]; then
            echo "$a"
            return
        fi
        sleep 0.1
    done
    echo "no '$2' in $1" >&2
    cat "$1" >&2
    exit 1
}

"$GMA" directory --listen "$net.1:0" --data "$work/dir" --allow-plaintext 2>"$work/dir.log" &
pids+=($!)
dir=$(addr_of "$work/dir.log" "gma directory listening on")
np=()
for i in $(seq 0 $((N - 1))); do
    ip netns exec "gma-fig-$tag-$i" "$GMA" netprobe --listen "$net.$((10 + i)):7700" \
        --directory "$dir" --source "host$i" --site seg --allow-plaintext 2>"$work/np$i.log" &
    pids+=($!)
    np+=($!)
done
for i in $(seq 0 $((N - 1))); do addr_of "$work/np$i.log" "gma netprobe listening on" >/dev/null; done
echo "4 netprobes at the default settings (period_ms 1000, transfer_bytes 262144, max_bytes_per_s 262144)"
echo "warming up 20 s (the first token appears after token_timeout_ms = 10 s) ..."
sleep 20

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
link_bytes() {
    ip netns exec "gma-fig-$tag-$1" cat /proc/net/dev |
        awk -v d="g${tag}v$1:" '$1 == d { print $2 + $10 }'
}
probe_bytes() {
    "$GMA" net status --directory "$dir" --output json |
        jq ".[] | select(.host == \"host$1\") | .bytes_sent + .bytes_received"
}
probes() {
    "$GMA" net status --directory "$dir" --output json | jq ".[] | select(.host == \"host$1\") | .probes"
}
hz=$(getconf CLK_TCK)
declare -a c0 l0 b0 p0
for i in $(seq 0 $((N - 1))); do
    c0[i]=$(cpu_ticks "${np[i]}"); l0[i]=$(link_bytes "$i"); b0[i]=$(probe_bytes "$i"); p0[i]=$(probes "$i")
done
t0=$(date +%s.%N)
sleep "$SECS"
t1=$(date +%s.%N)
printf "%-6s %8s %14s %16s %8s\n" host "cpu_%" "link_B/s" "probe_payload_B/s" probes
for i in $(seq 0 $((N - 1))); do
    c=$(cpu_ticks "${np[i]}"); l=$(link_bytes "$i"); b=$(probe_bytes "$i"); p=$(probes "$i")
    awk -v c="$((c - c0[i]))" -v hz="$hz" -v l="$((l - l0[i]))" -v b="$((b - b0[i]))" \
        -v p="$((p - p0[i]))" -v t0="$t0" -v t1="$t1" -v h="host$i" 'BEGIN {
        dt = t1 - t0
        printf "%-6s %8.3f %14.0f %16.0f %8d\n", h, 100 * c / hz / dt, l / dt, b / dt, p
    }'
done
echo "(over $SECS s; cpu_% of one core from /proc/PID/stat; link_B/s = rx + tx of the host's veth,"
echo " i.e. probes plus token messages plus directory keepalives)"

echo
echo "shaping every path into host3: tbf rate ${RATE_MBIT}mbit burst 32kbit latency 50ms"
tc qdisc add dev "g${tag}h3" root tbf rate "${RATE_MBIT}mbit" burst 32kbit latency 50ms
shaped_at=$(date +%s%N)
"$GMA" subscribe 'net.bw*' --directory "$dir" --output json >"$work/bw.jsonl" 2>/dev/null &
pids+=($!)
sleep "$SHAPED_SECS"
jq -r --argjson t "$shaped_at" 'select(.name == "net.bw" and .values.dst == "host3" and .timestamp_ns > $t) | .values.mbps' \
    "$work/bw.jsonl" | sort -g |
    awk -v r="$RATE_MBIT" '{ v[NR] = $1; e = ($1 - r) / r * 100; s += e; if (e < 0) e = -e; if (e > w) w = e }
        END {
            if (NR == 0) { print "no measurement toward host3"; exit 1 }
            printf "%d transfers toward host3: min %.2f, median %.2f, max %.2f Mbit/s; mean error %+.1f %%, worst |error| %.1f %%\n",
                NR, v[1], v[int((NR + 1) / 2)], v[NR], s / NR, w
        }'
jq -r 'select(.name == "net.bw.forecast" and (.source | endswith("/host3"))) | "\(.source) \(.values.mbps) \(.values.mbps_mae) \(.values.mbps_method)"' \
    "$work/bw.jsonl" |
    awk '{ f[$1] = $2; m[$1] = $3; k[$1] = $4 } END { for (s in f) printf "  latest forecast %s: %.2f Mbit/s (%s; mae over its last 32 predictions %.2f, the jump from the unshaped rate included)\n", s, f[s], k[s], m[s] }'
