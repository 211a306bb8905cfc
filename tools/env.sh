# Sourced by the tools: build cache and model cache live outside the clone, so a fresh clone
# (and CI) reuses them and a build is never committed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kazeia/target}"
export KAZEIA_MODELS="${KAZEIA_MODELS:-$HOME/.cache/kazeia/models}"
export KAZEIA_CACHE="${KAZEIA_CACHE:-$HOME/.cache/kazeia}"
