#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests (real processes on
# 127.0.0.1). protoc comes from the protoc-bin-vendored crate; the browser test's Chromium is
# Debian's `chromium` package, installed here when missing (idempotent, quiet).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x "${GMA_CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "== installing chromium (Debian package) for the dashboard's browser test"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
    # One process per test, a hung test killed after 5 min (.config/nextest.toml).
    echo "== cargo nextest run"
    cargo nextest run --workspace --locked --no-fail-fast
    echo "== cargo test --doc"
    cargo test --workspace --locked --doc
else
    echo "== cargo test (cargo-nextest not found)"
    cargo test --workspace --locked
fi
