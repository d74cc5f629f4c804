#!/bin/bash
# What benchmarks/gpu.py needs on a GPU machine without internet, gathered on a machine with it:
#   bash scripts/gpu_prepare.sh
# writes (git-ignored) benchmarks/.gpu/
#   wheels/*.whl      TRL 1.16 and what it brings that a GPU image with torch and transformers lacks,
#                     for Python 3.12, without their dependencies (pip download --no-deps): datasets,
#                     dill, multiprocess, xxhash, gguf (the embedded model's loader), math-verify and
#                     what it imports (latex2sympy2_extended, antlr4)
#   gguf.part1/part2  the embedded model's GGUF (98 MB) in two halves, each under the 64 MiB one
#                     device call carries: carry the wheels and part1 in one call, part2 in the next
#                     (the machine keeps ignored files between calls), then run benchmarks/gpu.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=benchmarks/.gpu
mkdir -p "$OUT/wheels"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$OUT/wheels" \
  trl==1.16.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 gguf==0.19.0 math-verify==0.9.0 \
  latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
PYTHONPATH=src "$PY" benchmarks/gpu.py --split-gguf
du -sh "$OUT"/wheels "$OUT"/gguf.part*
