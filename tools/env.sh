# Sourced by the tools: build cache and model cache live outside the clone, so a fresh clone
# (and CI) reuses them and a build is never committed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kazeia/target}"
export KAZEIA_MODELS="${KAZEIA_MODELS:-$HOME/.cache/kazeia/models}"
export KAZEIA_CACHE="${KAZEIA_CACHE:-$HOME/.cache/kazeia}"
# llama.cpp without Intel AMX kernels on x86_64: the flags of .cargo/config.toml's [env] (why:
# there), which a bare `cargo build` gets. Exported as well: on this machine, adding only the
# [env] entry left an existing target dir's llama.cpp built with AMX (still crashing); built
# again with the variable exported (`cargo clean -p llama-cpp-sys-2`), it had the flags.
# (This file's directory: BASH_SOURCE in bash, $0 in zsh; else the repository as the working
# directory. Empty flags would let the AMX kernels back: say so instead.)
if [ "$(uname -m)" = x86_64 ]; then
  if [ -n "${BASH_VERSION:-}" ]; then _kazeia_dir="$(dirname "${BASH_SOURCE[0]}")"; else _kazeia_dir="$(dirname "$0")"; fi
  [ -f "$_kazeia_dir/../.cargo/config.toml" ] || _kazeia_dir=tools
  _kazeia_flags="$(sed -n 's/^CFLAGS_x86_64_unknown_linux_gnu = "\(.*\)"$/\1/p' \
    "$_kazeia_dir/../.cargo/config.toml" 2>/dev/null)"
  if [ -n "$_kazeia_flags" ]; then
    export CFLAGS_x86_64_unknown_linux_gnu="${CFLAGS_x86_64_unknown_linux_gnu:-$_kazeia_flags}"
    export CXXFLAGS_x86_64_unknown_linux_gnu="${CXXFLAGS_x86_64_unknown_linux_gnu:-$_kazeia_flags}"
  else
    echo "tools/env.sh: no CFLAGS_x86_64_unknown_linux_gnu in .cargo/config.toml (source this file from the repository)" >&2
  fi
  unset _kazeia_flags _kazeia_dir
fi
