#!/usr/bin/env bash
# Builds the Debian package of the fabric with cargo-deb (metadata: [package.metadata.deb] in
# gma/Cargo.toml; units, configs and maintainer scripts: packaging/debian/; docs/packaging.md).
# The package holds two executables: `gma` (every role and the clients) and `gma-agent` (the
# agent alone, gma-producer's bin, which gma-agent.service runs). cargo-deb builds only the
# binaries of the package it packs, so this script builds both, stages them as
# target/<profile>/gma and target/<profile>/gma-agent in the directory of a profile nothing is
# built with, and runs `cargo deb --no-build --profile <that profile>`.
#
#   scripts/build-deb.sh          release build of `gma` (13 min of CPU from a cold release
#                                 cache; docs/packaging.md) and `agent`-profile build of
#                                 `gma-agent` (its smaller code keeps the agent's RSS small;
#                                 docs/PERFORMANCE.md), package in target/debian/
#   scripts/build-deb.sh --install-cargo-deb   only install cargo-deb (scripts/test.sh)
#   scripts/build-deb.sh --ci [BIN [AGENT]]  no build: packages the debug `gma` command the test
#                                 suite already built (BIN, default target/debug/gma-e2e, which
#                                 is `gma::main`, see tests/Cargo.toml) and the debug `gma-agent`
#                                 beside it (AGENT, default BIN's directory/gma-agent, which
#                                 scripts/test.sh builds) into target/debian/ci/, with fast
#                                 compression. Same files, units, configs and scripts as the
#                                 release package; only the binaries are debug builds.
#
# Installs cargo-deb (pinned) into the cargo home when it is missing (about 2 minutes of
# compiling from crates.io). Prints the absolute path of the .deb on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0

if ! cargo deb --version 2>/dev/null | grep -qF "$CARGO_DEB_VERSION"; then
    echo "== installing cargo-deb $CARGO_DEB_VERSION (cargo install, into the cargo home)" >&2
    CARGO_INCREMENTAL=0 cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked >&2
fi
if [ "${1:-}" = --install-cargo-deb ]; then
    exit 0
fi

target_dir=${CARGO_TARGET_DIR:-target}

# Copies `gma` ($2) and `gma-agent` ($3) into target/$1, where cargo-deb looks for the assets
# named target/release/... when it runs with --profile $1.
stage() {
    local built
    for built in "$2" "$3"; do
        if [ ! -x "$built" ]; then
            echo "build-deb: $built is missing: build it first" \
                "(cargo build -p gma-tests --bin gma-e2e and cargo build -p gma-producer" \
                "--bin gma-agent, or run the tests)" >&2
            exit 1
        fi
    done
    mkdir -p "$target_dir/$1"
    cp -f "$2" "$target_dir/$1/gma"
    cp -f "$3" "$target_dir/$1/gma-agent"
}

# How many of the functions producer/gma-agent.order places together (producer/build.rs) the
# agent built here still has: the names change with the toolchain and dependency versions, and
# a name the agent lacks loses its place (scripts/agent-order.sh writes the file again).
order_coverage() {
    local order=producer/gma-agent.order total have
    total=$(grep -cv '^#' "$order" || true)
    have=$(comm -12 <(nm --defined-only "$1" | awk '{print $NF}' | sort -u) \
        <(grep -v '^#' "$order" | sort -u) | wc -l)
    echo "build-deb: gma-agent has $have of the $total functions of $order" >&2
    if [ $((have * 10)) -lt $((total * 9)) ]; then
        echo "build-deb: fewer than 90 %: run scripts/agent-order.sh to place the agent's code" \
            "together again (docs/PERFORMANCE.md, \"The agent's code in one place\")" >&2
    fi
}

case "${1:-}" in
"")
    cargo build --release --locked -p gma --bin gma >&2
    cargo build --profile agent --locked -p gma-producer --bin gma-agent >&2
    order_coverage "$target_dir/agent/gma-agent"
    # deb-release: the release profile under another name (Cargo.toml), only a staging place.
    stage deb-release "$target_dir/release/gma" "$target_dir/agent/gma-agent"
    deb=$(cargo deb -p gma --no-build --profile deb-release --output "$target_dir/debian/")
    ;;
--ci)
    built=${2:-$target_dir/debug/gma-e2e}
    agent=${3:-$(dirname "$built")/gma-agent}
    # deb-ci: the dev profile under a name cargo-deb accepts (Cargo.toml); nothing is ever
    # built with it.
    stage deb-ci "$built" "$agent"
    deb=$(cargo deb -p gma --no-build --profile deb-ci --fast --output "$target_dir/debian/ci/")
    ;;
*)
    echo "usage: scripts/build-deb.sh [--ci [BIN [AGENT]] | --install-cargo-deb]" >&2
    exit 2
    ;;
esac

# cargo-deb prints the path of the package it wrote.
realpath "$deb"
