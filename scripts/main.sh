#!/usr/bin/env bash
# The main job on the embedded default: in-process memory servers, no other setup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --release --quiet -p scad-examples --bin scad-main -- "$@"
