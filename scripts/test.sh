#!/usr/bin/env bash
# Every check and every test: formatting, one feature set per shared dependency, no
# Polars in the main job and the wheel, clippy with warnings as errors (with and
# without the `rdma` feature), the whole workspace's tests with the feature on, then the
# wheel's type stubs (mypy stubtest) and the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
cargo fmt --all --check
# One compiled dependency stack for the main job, the wheel, the benchmarks and tests.
bash scripts/check-shared-stack.sh
# The main job (and the wheel) build without Polars.
bash scripts/check-no-polars.sh
cargo clippy --workspace --all-targets --all-features -- -D warnings
# Only core changes with the `rdma` feature (checked here without it).
cargo clippy -p scad-core --features cli,redis,redis-server --all-targets -- -D warnings
cargo test --workspace --all-features
# The Python wheel (dev profile, into .venv): drop-in modules, tools, modern API.
bash scripts/wheel.sh
# The type stubs (py/python/scad/_native.pyi) against the built module.
.venv/bin/python -m mypy.stubtest scad._native --allowlist py/stubtest-allowlist.txt
.venv/bin/python -m pytest -q py/tests
