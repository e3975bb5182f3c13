#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests (real processes on
# 127.0.0.1). Installs nothing by hand: protoc comes from the protoc-bin-vendored crate.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked
