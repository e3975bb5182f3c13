#!/usr/bin/env bash
# Builds the Debian package of the fabric with cargo-deb (metadata: [package.metadata.deb] in
# gma/Cargo.toml; units, configs and maintainer scripts: packaging/debian/; docs/packaging.md).
#
#   scripts/build-deb.sh          release build of `gma` (13 min of CPU from a cold release
#                                 cache; docs/packaging.md), package in target/debian/
#   scripts/build-deb.sh --install-cargo-deb   only install cargo-deb (scripts/test.sh)
#   scripts/build-deb.sh --ci [BIN]  no build: packages the debug `gma` command the test
#                                 suite already built (BIN, default target/debug/gma-e2e, which
#                                 is `gma::main`, see tests/Cargo.toml) into target/debian/ci/,
#                                 with fast compression. Same files, units, configs and scripts as the
#                                 release package; only the binary is a debug build.
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
case "${1:-}" in
"")
    deb=$(cargo deb -p gma --output "$target_dir/debian/")
    ;;
--ci)
    built=${2:-$target_dir/debug/gma-e2e}
    if [ ! -x "$built" ]; then
        echo "build-deb: $built is missing: build the test binary first" \
            "(cargo build -p gma-tests --bin gma-e2e, or run the tests)" >&2
        exit 1
    fi
    # cargo-deb packages target/<profile>/gma: give it the suite's binary under that name, in
    # the directory of the profile deb-ci (the dev profile under a name cargo-deb accepts;
    # nothing is ever built with it).
    mkdir -p "$target_dir/deb-ci"
    cp -f "$built" "$target_dir/deb-ci/gma"
    deb=$(cargo deb -p gma --no-build --profile deb-ci --fast --output "$target_dir/debian/ci/")
    ;;
*)
    echo "usage: scripts/build-deb.sh [--ci [BIN] | --install-cargo-deb]" >&2
    exit 2
    ;;
esac

# cargo-deb prints the path of the package it wrote.
realpath "$deb"
