#!/usr/bin/env bash
# Checks that the builds below do not contain Polars: `cargo tree -e normal` of each
# (what its binaries link) must list no `polars*` package. Reads Cargo.lock only;
# builds nothing. Run by scripts/test.sh.
#
#   bash scripts/check-no-polars.sh                       # the builds listed below
#   bash scripts/check-no-polars.sh "-p scad-tpcds" ...   # these builds (cargo tree args)
#
# When one fails, `cargo tree -e normal -i polars <its args>` shows which dependency
# brings Polars in.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(rustc -vV | sed -n 's/^host: //p')"
if [ $# -gt 0 ]; then
    builds=("$@")
else
    builds=(
        # The main job, tpcds-main: scad-tpcds with its default features.
        "-p scad-tpcds"
        # The wheel: scad-py as maturin builds it.
        "-p scad-py --features extension-module"
    )
fi
failed=0
for b in "${builds[@]}"; do
    # shellcheck disable=SC2086 # each entry is a list of cargo tree arguments
    tree="$(cargo tree --locked -e normal --target "$target" --prefix none -f '{p}' $b | sed 's/ (\*)$//' | sort -u)"
    found="$(grep -E '^polars([-_][A-Za-z0-9_-]+)? v' <<<"$tree" || true)"
    if [ -n "$found" ]; then
        echo "check-no-polars: \`cargo tree -e normal $b\` contains Polars ($(wc -l <<<"$found") packages):"
        sed 's/^/   /' <<<"$found" | head -5
        echo "   (\`cargo tree -e normal -i polars $b\` shows what brings it in)"
        failed=1
    else
        echo "check-no-polars: $b builds without Polars ($(wc -l <<<"$tree") packages)"
    fi
done
exit "$failed"
