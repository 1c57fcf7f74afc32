#!/usr/bin/env bash
# The main job: the 99 TPC-DS queries from their SQL text through the query engine over
# embedded memory servers (tcp), SF 1 generated on first use (cached under data/tpcds),
# each answer checked against DuckDB's, DuckDB in memory timed in the same run. Options
# of tpcds-main pass through, e.g. `scripts/main.sh --queries 1,16,94,95 --budget 25%
# --transport redis --json results.jsonl`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --release --quiet -p scad-tpcds --bin tpcds-main -- "$@"
