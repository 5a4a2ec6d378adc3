#!/usr/bin/env bash
# `make ci-fresh`: runs .ci/run as a newcomer's machine would, in a fresh clone of this repository's
# HEAD with an empty HOME (so an empty CARGO_HOME: no crates, no tansu, no cargo-fuzz; no pip cache;
# no installed DuckDB extensions) and a fresh venv, then prints each step's time and the total.
# Only the Rust toolchain is shared (rustup's, read through RUSTUP_HOME). Takes the machine's cores
# for most of an hour; the clone is kept in $CI_FRESH_DIR (default /tmp/ci-fresh.<time>) for a look.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${CI_FRESH_DIR:-/tmp/ci-fresh.$(date +%s)}"
mkdir -p "$dir/home"
git clone -q "$here" "$dir/repo"
toolchain_bin="$(dirname "$(command -v cargo)")"
export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
export HOME="$dir/home"
export CARGO_HOME="$HOME/.cargo"
export PATH="$CARGO_HOME/bin:$toolchain_bin:$PATH"
export PIP_NO_CACHE_DIR=1
unset CARGO_TARGET_DIR VIRTUAL_ENV
cd "$dir/repo"
start=$(date +%s)
set +e
bash .ci/run 2>&1 | tee "$dir/ci.log"
code=${PIPESTATUS[0]}
set -e
echo "ci-fresh: exit $code in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s (log: $dir/ci.log)"
exit "$code"
