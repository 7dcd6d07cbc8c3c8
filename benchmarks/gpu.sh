#!/usr/bin/env bash
# Run `hasten bench` on a CUDA machine, within about 8 minutes on one modern GPU (H100/H200 class).
#
#   bash benchmarks/gpu.sh                       # from anywhere; it works in the repository root
#   OUT=bench/gpu REPEATS=3 EXTRA="--naive-epochs 4" bash benchmarks/gpu.sh
#
# Python: the first of $PYTHON, python3, python whose torch sees a GPU, used as it is (a CUDA torch is never
# reinstalled); with none, a virtual environment .venv-gpu/ with `pip install torch` (PyPI's Linux wheels are
# CUDA builds). hasten runs from this checkout (PYTHONPATH), not installed. Its other dependencies, where
# missing, go into .gpu-site/ (on PYTHONPATH): from PyPI, or on a machine without internet from the wheels in
# $HASTEN_WHEELS (`pip download` them elsewhere: pydantic, pydantic-core, annotated-types, typing-inspection,
# and any other the script names as missing).
# Data: Fashion-MNIST as hasten resolves it ($HASTEN_DATA, ~/.cache/hasten, /usr/share/datasets, download);
# without internet, put the four official .gz files in a folder and set HASTEN_DATA to it.
#
# What it runs: the naive loop and fashion-fast in fp32 and in bf16, REPEATS times each after a warm-up, each
# run in its own process, cut off after LIMIT seconds (default 470). Results in $OUT (default bench/gpu):
# report.md, results.csv, results.json and the plots.
# GAN=1 also runs the DCGAN in fp32, bf16 and fp16 (per-network loss scaling) on the shipped dcgan-fashion
# recipe's full budget (GAN_ARGS, default 4 epochs of all 60,000 images), every precision trained, cut off
# after GAN_LIMIT seconds (default 900): speed, memory, Fréchet and class mix in $OUT/gan (docs/gan.md).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench/gpu}
REPEATS=${REPEATS:-3}
LIMIT=${LIMIT:-470}
SITE=${SITE:-.gpu-site}
EXTRA=${EXTRA:-}

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

PY=""
for candidate in ${PYTHON:-} python3 python; do
  if command -v "$candidate" >/dev/null && has_cuda_torch "$candidate"; then PY=$(command -v "$candidate"); break; fi
done
if [ -z "$PY" ]; then
  echo "no Python with a CUDA torch found: installing torch into .venv-gpu/"
  [ -x .venv-gpu/bin/python ] || python3 -m venv .venv-gpu
  .venv-gpu/bin/python -m pip install --quiet torch
  PY=.venv-gpu/bin/python
  has_cuda_torch "$PY" || { echo "error: torch sees no GPU here ($(nvidia-smi -L 2>&1 | head -1))"; exit 1; }
fi
export PYTHONPATH="$PWD/$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

# hasten's dependencies (pyproject.toml) that this Python lacks
missing=$("$PY" - <<'EOF'
import importlib.metadata as metadata
import re
from pathlib import Path

text = Path("pyproject.toml").read_text()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
missing = []
for requirement in re.findall(r'^\s*"([^"]+)"', block, re.M):
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        missing.append(requirement.replace(" ", ""))
print(" ".join(missing))
EOF
)
if [ -n "$missing" ]; then
  echo "installing into $SITE: $missing"
  mkdir -p "$SITE"
  if [ -n "${HASTEN_WHEELS:-}" ]; then
    "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$HASTEN_WHEELS"/*.whl
  else
    # shellcheck disable=SC2086
    "$PY" -m pip install --quiet --target "$SITE" $missing
  fi
fi

"$PY" - <<'EOF'
import torch

print(
    f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, "
    f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}"
)
EOF
"$PY" -m hasten data fetch fashion-mnist

set -x
# shellcheck disable=SC2086
timeout --signal=INT "$LIMIT" "$PY" -m hasten bench fashion-fast \
  --vary precision=fp32,bf16 --repeats "$REPEATS" --out "$OUT" $EXTRA
set +x
echo "report: $OUT/report.md"
if [ "${GAN:-0}" = 1 ]; then
  set -x
  # shellcheck disable=SC2086
  timeout --signal=INT "${GAN_LIMIT:-900}" "$PY" benchmarks/gan.py --out "$OUT/gan" --max-train-seconds 100000 \
    ${GAN_ARGS:---epochs 4 --subset 60000}
  set +x
  echo "DCGAN report: $OUT/gan/report.md"
fi
