#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs (Debian packages, a Python
# virtual environment outside the repo), then checks formatting and lints, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

source tests/setup.sh

# A clean build gains nothing from incremental state, which only takes more disk (CI once
# ran out of disk while building; a clean test build here takes 5.5 GB without it).
export CARGO_INCREMENTAL=0

cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test --no-fail-fast
