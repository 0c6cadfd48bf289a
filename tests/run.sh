#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs (Debian packages, a Python
# virtual environment outside the repo), then checks formatting and lints, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

source tests/setup.sh

# A clean build gains nothing from incremental state, which would double the disk the
# test binaries take (CI once ran out of disk while building).
export CARGO_INCREMENTAL=0

cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test --no-fail-fast
