#!/usr/bin/env bash
# Checks that the main job (scad-tpcds), the wheel (scad-py), the benchmarks
# (scad-benches) and the other workspace crates ask for the same features of every
# dependency they share, so one compiled stack serves them all (a difference recompiles
# everything above the dependency: Arrow, DataFusion, Polars). Reads Cargo.lock only;
# builds nothing. A difference names the package; add it to workspace-hack/Cargo.toml
# with the union of the features listed.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(rustc -vV | sed -n 's/^host: //p')"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
# (scad-py as maturin builds it: with its extension-module feature.)
crates=(scad-core scad-remote-array scad-remote-frame scad-npjoin scad-examples scad-tpcds scad-benches)
tree() { cargo tree --locked -e normal,build --target "$target" --prefix none -f '{p} [{f}]' "$@"; }
for p in "${crates[@]}"; do
    tree -p "$p" >"$dir/$p"
done
# As scripts/test.sh builds: the whole workspace with every feature, and the wheel.
tree --workspace --all-features >"$dir/workspace-all-features"
tree -p scad-py --features extension-module >"$dir/wheel"
python3 - "$dir" "${crates[@]}" workspace-all-features wheel <<'PY'
import collections, os, re, sys
d, crates = sys.argv[1], sys.argv[2:]
# Per package version: the feature sets each crate's graph asks for (a package built
# for the host and for the target may appear twice, with different features).
asked = collections.defaultdict(dict)
for c in crates:
    sets = collections.defaultdict(set)
    for line in open(os.path.join(d, c)):
        m = re.match(r"(\S+) (v\S+).*?\[([^\]]*)\]", line)
        if m and not m.group(1).startswith("scad-"):
            sets[f"{m.group(1)} {m.group(2)}"].add(m.group(3))
    for k, v in sets.items():
        asked[k][c] = tuple(sorted(v))
bad = [k for k, v in asked.items() if len(set(v.values())) > 1]
for k in sorted(bad):
    print(f"features of {k} differ between crates:")
    for c, v in sorted(asked[k].items()):
        print(f"   {c}: {' | '.join('[' + s + ']' for s in v)}")
if bad:
    sys.exit("check-shared-stack: the crates would compile separate dependency stacks")
print(f"check-shared-stack: the {len(crates)} builds ask for one feature set per shared dependency ({len(asked)} packages)")
PY
