#!/usr/bin/env bash
# Installs the foliofs Python module as its users do, `pip install
# crates/foliofs-py` (pip fetches maturin, the build backend of its
# pyproject.toml, from PyPI and builds the wheel), in a fresh virtual
# environment with pytest, and runs the module's pytest suite there.
#
# Needs python3 with its venv module (Debian: python3-venv) and PyPI. The
# wheel is built with cargo's dev profile (MATURIN_PEP517_ARGS) in the
# workspace's target directory (pip builds in the source tree; the target
# is also exported as CARGO_TARGET_DIR), so it reuses the debug artifacts of
# `cargo build` and `cargo test` instead of a release build, which takes
# minutes on a small machine. The environment is left in
# target/python-tests/venv. Any failure fails the script: nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in
  /*) ;;
  *) target="$root/$target" ;;
esac
export CARGO_TARGET_DIR="$target"
export MATURIN_PEP517_ARGS="--profile dev"

# Made afresh each run, at the same path: maturin hands the interpreter's
# path to pyo3's build script, and a new path would rebuild pyo3.
venv="$target/python-tests/venv"
python3 -m venv --clear "$venv"
python="$venv/bin/python"
"$python" -m pip install -q pytest
"$python" -m pip install crates/foliofs-py
# From outside the tree, so that `import foliofs` is the installed module.
cd "$venv"
"$python" -m pytest -q -p no:cacheprovider "$root/crates/foliofs-py/tests"
