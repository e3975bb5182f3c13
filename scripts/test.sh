#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and end-to-end tests (real processes on
# 127.0.0.1, or in network namespaces the tests make). protoc comes from the
# protoc-bin-vendored crate; the browser test's Chromium is Debian's `chromium` package and the
# namespace tests' `ip` and `tc` come from `iproute2`, and the Python client test's python3 and
# venv from `python3`/`python3-venv`, and the Slurm tests' batch system from `slurmctld`,
# `slurmd`, `slurm-client` and `munge`, and the SNMP tests' agent from `snmpd` and `snmp`, and the Prometheus tests' server and promtool
# from `prometheus`, installed here when missing (idempotent, quiet).
# Under CI=true a test whose capability is missing fails with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
apt_updated=""
apt_install() {
    if [ -z "$apt_updated" ]; then $SUDO apt-get update -qq; apt_updated=1; fi
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The wire test (tests/tests/wire.rs) makes a Python virtual environment under target/tmp and
# pip-installs grpcio, grpcio-tools, grpcio-reflection and grpcio-health-checking into it.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "== installing python3 and python3-venv (Debian packages) for the Python client test"
    apt_install python3 python3-venv
fi

if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    echo "== installing iproute2 (ip, tc) for the network-namespace tests (netprobe, jepsen)"
    apt_install iproute2
fi

if [ ! -x "${GMA_CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "== installing chromium (Debian package) for the dashboard's browser test"
    apt_install chromium
fi

# The Slurm tests (tests/tests/slurm.rs) start a throw-away single-machine cluster under a temp
# dir (munged, slurmctld, slurmd on 127.0.0.1). Installing the packages must start no daemon
# system-wide: policy-rc.d denies it, and their units are disabled afterwards.
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
    || ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    echo "== installing slurmctld slurmd slurm-client munge (Debian packages) for the Slurm tests"
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
    fi
    apt_install slurmctld slurmd slurm-client munge
    if command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl disable munge slurmctld slurmd >/dev/null 2>&1 || true
    fi
fi

# The SNMP tests (tests/tests/snmp.rs) start their own snmpd under a temp dir on 127.0.0.1 and
# a free port, and use snmpset once (package snmp). Same rule: no daemon started system-wide.
if ! command -v snmpd >/dev/null 2>&1 || ! command -v snmpset >/dev/null 2>&1; then
    echo "== installing snmpd snmp (Debian packages) for the SNMP tests"
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
    fi
    apt_install snmpd snmp
    if command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl disable snmpd >/dev/null 2>&1 || true
    fi
fi

# The Prometheus tests (PromQL over the archive with promtool; remote write into a real
# prometheus started under a temp dir on 127.0.0.1) use Debian's `prometheus` package
# (prometheus + promtool). Same rule: no daemon started system-wide.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    echo "== installing prometheus (Debian package: prometheus, promtool) for the Prometheus tests"
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
    fi
    apt_install prometheus
    if command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl disable prometheus >/dev/null 2>&1 || true
    fi
fi
# The https remote-write test queries its TLS-only prometheus with curl.
if ! command -v curl >/dev/null 2>&1; then
    echo "== installing curl for the https remote-write test"
    apt_install curl
fi

# The Debian package test (tests/tests/deb.rs) builds the .deb with cargo-deb (pinned in
# scripts/build-deb.sh; `cargo install` into the cargo home when missing: about 2 minutes of
# compiling from crates.io, once), installs it with dpkg and checks its units with
# systemd-analyze (Debian's `systemd`).
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "== installing systemd (systemd-analyze) for the Debian package test"
    apt_install systemd
fi
scripts/build-deb.sh --install-cargo-deb

# One clean build, not an incremental cache beside it (it doubles the target dir's size).
export CARGO_INCREMENTAL=0

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== no import cycles among the modules of any crate (submodules included)"
DEPTH=2 python3 scripts/module-cycles.py */src

# The agent-only executable the agent tests run (tests/src: agent_bin): a test run builds the
# bin targets of the tests crate only.
echo "== cargo build gma-agent"
cargo build --locked -p gma-producer --bin gma-agent

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
