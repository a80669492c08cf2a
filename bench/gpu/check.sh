#!/usr/bin/env bash
# One prepared GPU check (issue 53): install lpes from this working tree without network, then run
# bench/gpu/check.py: lpes's search replica on a Llama-3-8B-shaped model in bfloat16 (prefill and decode
# positions/s, peak GPU memory, the default 7B search's GPU time), lpes-search on CUDA against the CPU in
# bfloat16 and float32, lpes-convert --to hf and lpes-validate on CUDA; one JSON (OUT/gpu_check.json), one
# line per check, the total wall time.
#
#   bench/gpu/check.sh [--out DIR]      on a machine with CUDA (DIR defaults to $OUT): under 8 minutes on an H100
#   bench/gpu/check.sh --tiny --out DIR the same steps at a tiny size, on the CPU without a GPU (make test)
#
# What the GPU machine lacks travels in bench/gpu/wheels/ (ignored by git; make gpu-wheels fills it): cmaes,
# and setuptools for a Python without it. PYTHON picks the interpreter (default: .venv's, else python3);
# LPES_GPU_WORK the scratch folder of the install (default: a new temporary folder, removed at the end).
set -euo pipefail
started=$(date +%s.%N)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
if [ -n "${LPES_GPU_WORK:-}" ]; then
  WORK="$LPES_GPU_WORK"
else
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi
SITE="$WORK/site"
"$PYTHON" "$ROOT/bench/gpu/install.py" --site "$SITE" --work "$WORK"
# The installed lpes and its commands come first; the machine's torch and transformers stay what they are.
export PATH="$SITE/bin:$PATH" PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
status=0
"$PYTHON" "$ROOT/bench/gpu/check.py" "$@" || status=$?
echo "check.sh: total wall time $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s, install included (exit $status)"
exit $status
