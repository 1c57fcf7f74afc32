#!/usr/bin/env bash
# The main job: the 99 TPC-DS queries from their SQL text through the query engine over
# embedded memory servers (tcp), SF 1 generated on first use (cached under data/tpcds),
# each answer checked against DuckDB's, DuckDB in memory timed in the same run. Options
# of tpcds-main pass through, e.g. `scripts/main.sh --queries 1,16,94,95 --budget 25%
# --transport redis --json results.jsonl`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -x "${CARGO_TARGET_DIR:-target}/release/tpcds-main" ]; then
    echo "main: the first run builds the engine (Arrow, DataFusion) in release: about 20 minutes on 2 cores; later runs start at once" >&2
fi
cargo run --release -p scad-tpcds --bin tpcds-main -- "$@"
