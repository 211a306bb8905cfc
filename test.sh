#!/usr/bin/env bash
# The whole test suite, on the real models and the real engine. Set-up included.
set -euo pipefail
cd "$(dirname "$0")"
tools/setup
source tools/env.sh
cargo test --release --locked --workspace
