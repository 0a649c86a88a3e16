#!/usr/bin/env bash
# The GPU checks, one call of the device tool (under 8 minutes on an H200); every figure and
# log goes to $OUT. The machine reaches no package index and has torch and transformers but
# not pydantic or llguidance, so their wheels travel in .gpu/whl, fetched here first:
#
#   python -m pip download --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d .gpu/whl pydantic llguidance
#   device run: bash bench/gpu_check.sh   (carry .gpu, timeout_s 540)
#
# 1. bench.gpu beside transformers' generate on the same random weights (0.5B and 7B, CUDA
#    graphs on, 128 tokens): each figure, its ratio and its share of the card's limit.
# 2. bench.gpu_load on the 1.5B: 150 mixed requests, a quarter cancelled; none may raise or
#    be left unfinished.
# bench.real_weights verify (the embedded 0.5B's real weights against the CPU's answers) needs
# its GGUF's pieces, one call each (a call carries 64 MiB): docs/operations.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
PY=python3

missing=$($PY - <<'EOF'
import importlib.util
print(" ".join(m for m in ("pydantic", "llguidance") if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  $PY -m pip install --quiet --no-index --find-links .gpu/whl $missing 2>&1 | tee "$OUT/pip.txt"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"

run() {  # name, seconds, command...
  local name=$1 seconds=$2
  shift 2
  echo "== $name ($(date -u +%H:%M:%S))" | tee -a "$OUT/summary.txt"
  timeout "$seconds" "$@" > "$OUT/$name.txt" 2>&1
  echo "exit $? after $SECONDS s" | tee -a "$OUT/summary.txt"
  tail -n 40 "$OUT/$name.txt"
}

run gpu 300 $PY -m bench.gpu --models 0.5b,7b --graphs on --tokens 128 --peer transformers
run gpu_load 120 $PY -m bench.gpu_load --models 1.5b --requests 150
