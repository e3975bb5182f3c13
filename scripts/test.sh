#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests (real processes on
# 127.0.0.1). Installs nothing by hand: protoc comes from the protoc-bin-vendored crate.
set -euo pipefail
cd "$(dirname "$0")/.."

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
