# Sourced by the tools: build cache and model cache live outside the clone, so a fresh clone
# (and CI) reuses them and a build is never committed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kazeia/target}"
export KAZEIA_MODELS="${KAZEIA_MODELS:-$HOME/.cache/kazeia/models}"
export KAZEIA_CACHE="${KAZEIA_CACHE:-$HOME/.cache/kazeia}"
# Python packages (the reference tools, gguf, model wheels): a Debian or Ubuntu python3 is
# "externally managed" (PEP 668) and its pip refuses to install anything. There the tools use
# a venv of their own in the cache, first on PATH (scripts' `#!/usr/bin/env python3` too).
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' 2>/dev/null; then
  # Without python3-venv, `venv` fails at ensurepip and leaves a venv with no pip: removed,
  # so that the next try (tools/setup's, once it installed python3-venv) makes a whole one.
  if [ ! -x "$KAZEIA_CACHE/venv/bin/pip" ]; then
    rm -rf "$KAZEIA_CACHE/venv"
    mkdir -p "$KAZEIA_CACHE"
    python3 -m venv "$KAZEIA_CACHE/venv" >&2 || {
      rm -rf "$KAZEIA_CACHE/venv"
      echo "tools/env.sh: python3 -m venv failed: install python3-venv (tools/setup does)" >&2
    }
  fi
  [ -x "$KAZEIA_CACHE/venv/bin/pip" ] && export PATH="$KAZEIA_CACHE/venv/bin:$PATH"
fi
# This file's directory: BASH_SOURCE in bash, $0 in zsh; else the repository as the working
# directory.
if [ -n "${BASH_VERSION:-}" ]; then _kazeia_dir="$(dirname "${BASH_SOURCE[0]}")"; else _kazeia_dir="$(dirname "$0")"; fi
[ -f "$_kazeia_dir/../.cargo/config.toml" ] || _kazeia_dir=tools
# One build cache for every checkout (the working copy, CI's clean clones). Cargo calls a
# workspace crate's build fresh when none of its sources is newer than the build, and two
# checkouts' crates share one build (their hashes use paths relative to the workspace): a
# clean clone's newer build passed for the working copy's older, edited main.rs, and a test ran
# the clone's binary (session 22). So when the checkout using the cache changes, its tracked
# files are touched: cargo builds our crates again from this checkout's sources (~3 min on 2
# cores; the dependencies stay built).
_kazeia_root="$(cd "$_kazeia_dir/.." 2>/dev/null && pwd -P)"
if [ -n "$_kazeia_root" ] && [ -f "$_kazeia_root/Cargo.toml" ]; then
  mkdir -p "$CARGO_TARGET_DIR"
  if [ "$(cat "$CARGO_TARGET_DIR/.kazeia-checkout" 2>/dev/null)" != "$_kazeia_root" ]; then
    if [ -d "$_kazeia_root/.git" ] || [ -f "$_kazeia_root/.git" ]; then
      (cd "$_kazeia_root" && git ls-files -z | xargs -0 touch -c --)
    else
      find "$_kazeia_root" -name .git -prune -o -type f -exec touch -c -- {} +
    fi
    printf '%s\n' "$_kazeia_root" >"$CARGO_TARGET_DIR/.kazeia-checkout"
  fi
fi
unset _kazeia_root
# llama.cpp without Intel AMX kernels on x86_64: the flags of .cargo/config.toml's [env] (why:
# there), which a bare `cargo build` gets. Exported as well: on this machine, adding only the
# [env] entry left an existing target dir's llama.cpp built with AMX (still crashing); built
# again with the variable exported (`cargo clean -p llama-cpp-sys-2`), it had the flags.
# (Empty flags would let the AMX kernels back: say so instead.)
if [ "$(uname -m)" = x86_64 ]; then
  _kazeia_flags="$(sed -n 's/^CFLAGS_x86_64_unknown_linux_gnu = "\(.*\)"$/\1/p' \
    "$_kazeia_dir/../.cargo/config.toml" 2>/dev/null)"
  if [ -n "$_kazeia_flags" ]; then
    export CFLAGS_x86_64_unknown_linux_gnu="${CFLAGS_x86_64_unknown_linux_gnu:-$_kazeia_flags}"
    export CXXFLAGS_x86_64_unknown_linux_gnu="${CXXFLAGS_x86_64_unknown_linux_gnu:-$_kazeia_flags}"
  else
    echo "tools/env.sh: no CFLAGS_x86_64_unknown_linux_gnu in .cargo/config.toml (source this file from the repository)" >&2
  fi
  unset _kazeia_flags
fi
unset _kazeia_dir
