#!/usr/bin/env bash
# Builds the foliofs Python module (crates/foliofs-py) with cargo and runs
# its pytest suite against it. (`maturin develop` in crates/foliofs-py builds
# and installs the same module; cargo alone keeps CI off maturin.)
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build -p foliofs-py
module_dir="$(mktemp -d)"
trap 'rm -rf "$module_dir"' EXIT
cp "$target/debug/libfoliofs_py.so" "$module_dir/foliofs.abi3.so"
PYTHONPATH="$module_dir" python3 -m pytest -q crates/foliofs-py/tests
