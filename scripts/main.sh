#!/usr/bin/env bash
# The main job: TPC-DS q1/q16/q94/q95 as pipelines over embedded memory servers (tcp),
# SF 0.1 generated on first use, results checked against DuckDB. Options of
# tpcds-main pass through, e.g. `scripts/main.sh --sf 1 --budget 25% --transport redis`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --release --quiet -p scad-tpcds --bin tpcds-main -- "$@"
