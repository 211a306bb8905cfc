#!/usr/bin/env bash
# The whole test suite, on the real models and the real engine. Set-up included.
set -euo pipefail
cd "$(dirname "$0")"
tools/setup
source tools/env.sh
# Style and lints first: a warning fails the suite (rustfmt.toml, [workspace.lints]).
cargo fmt --all --check
cargo clippy --release --locked --workspace --all-targets --features kazeia-daemon/dbus -q -- -D warnings
# Every tool the README lists, in its smoke mode (tiny inputs, one rep): none breaks unseen.
tools/smoke
# The JVM client (clients/jvm): Debian's JDK 17 and JUnit 5, against a daemon it starts. Its
# failure is reported after the Rust tests have run too.
jvm=0
clients/jvm/run-tests || jvm=$?
# Every test binary runs even when one fails: a red run names all its failures at once.
rust=0
cargo test --release --locked --workspace --features kazeia-daemon/dbus --no-fail-fast || rust=$?
# The device's CPU threading: llama.cpp without OpenMP, as llama-cpp-sys-2 builds it for Android
# (ggml's own thread pool), under the engine's tests (tests/side_by_side.rs decodes two roles at
# once). A second build of llama.cpp, cached beside the first.
device=0
cargo test --release --locked -p kazeia-engine --no-default-features --no-fail-fast || device=$?
for rc in "$rust" "$device" "$jvm"; do
    [ "$rc" = 0 ] || exit "$rc"
done
