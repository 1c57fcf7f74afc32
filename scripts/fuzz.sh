#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for a bounded time each and prints
# the executions run and crashes found per target.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 seconds, all targets
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each target
# starts from fuzz/seeds/<target> and fuzz/regressions/<target> and keeps its growing
# corpus in fuzz/corpus/<target> (not committed). A crash leaves its input in
# fuzz/artifacts/<target>/; fix it, then copy the input to fuzz/regressions/<target>/
# so `cargo test` (remote-array/tests/fuzz_regressions.rs) replays it on stable.
set -euo pipefail

seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
    echo "usage: $0 [SECONDS] [TARGET...]" >&2
    exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(protocol_decode durl_parse rdma_exchange array_meta)
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/fuzz/target}"
cargo +nightly fuzz build

summary=()
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t" "regressions/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    log="$(mktemp)"
    set +e
    cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" "regressions/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
        -timeout=10 >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    after=$(find "artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes="? (exit $rc, see below)"
        tail -30 "$log"
        status=1
    elif [ "$crashes" -ne 0 ]; then
        grep -m5 -E 'panicked|ERROR: libFuzzer|SUMMARY' "$log" || true
        status=1
    fi
    summary+=("$(printf '%-16s %8ss %14s executions %6s crashes' "$t" "$seconds" "${execs:-?}" "$crashes")")
    rm -f "$log"
done
printf '%s\n' "${summary[@]}"
exit "$status"
