#!/usr/bin/env bash
# The main job on the default models: set up, then one turn through the guarded cascade
# (input guard, Thinker, output guard sentence by sentence).
set -euo pipefail
cd "$(dirname "$0")"
tools/setup
source tools/env.sh
exec "$CARGO_TARGET_DIR/release/kazeia" run guarded-chat --config models.toml --temperature 0 \
  --text "${*:-What is the capital of France? Answer in one short sentence.}"
