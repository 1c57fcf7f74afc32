#!/usr/bin/env bash
# Builds the scad wheel from py/ and installs it into .venv (created by setup.sh).
# Without arguments it builds with the dev profile, which shares the compiled
# dependencies with `cargo test`; pass --release for benchmarks and real use.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/maturin ] || bash scripts/setup.sh
cd py
VIRTUAL_ENV="$PWD/../.venv" ../.venv/bin/maturin develop -q "$@"
