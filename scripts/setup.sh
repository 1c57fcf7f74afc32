#!/usr/bin/env bash
# Installs what building and testing Scad needs on a fresh Debian machine:
# the RDMA and clang development packages (for the `rdma` feature) and redis-server
# (a baseline and a backend), iproute2 (`ip`: the protected-mode test makes a network
# namespace), and the Python virtual environment `.venv` with the
# packages of the Python tools. Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(pkg-config libibverbs-dev librdmacm-dev libclang-dev redis-server fonts-dejavu-core iproute2)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; install the Rust toolchain (rustup) first" >&2
    exit 1
fi

# Python: a virtual environment at .venv with the packages the tests, the wheel build and
# the TPC-DS generator need. The wheel itself is built by scripts/wheel.sh.
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating the Python virtual environment .venv" >&2
    if ! python3 -m venv .venv; then
        echo "setup: python3 -m venv failed; install python3-venv (apt-get install python3-venv)" >&2
        exit 1
    fi
fi
.venv/bin/pip install -q --disable-pip-version-check -r py/requirements-dev.txt -r benches/tpcds/requirements.txt
