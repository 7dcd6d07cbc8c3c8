#!/usr/bin/env bash
# Every GPU measurement hasten needs, in one go, within about 9 minutes on one modern GPU (H100/H200 class).
#
#   bash benchmarks/gpu.sh                       # from anywhere; it works in the repository root
#   OUT=bench/gpu bash benchmarks/gpu.sh
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
# What it runs, each phase cut off after its own limit (seconds, overridable) so the whole stays under 10 minutes,
# a phase that fails or times out reported and the next one run all the same:
#   tests     (LIMIT_TESTS=60):      the tests that need the GPU itself (marked cuda) and the machine's decisions
#                                    (marked machine) on this machine's gathered facts
#   precision (LIMIT_PRECISION=160): fashion-fast for 3 epochs in fp32, bf16, fp16 and fp16-master, side by side
#   layout    (LIMIT_LAYOUT=110):    bf16 channels_last with torch.compile off and on, 2 epochs (the layouts'
#                                    own speeds: the auto phase's probe line)
#   auto      (LIMIT_AUTO=30):       one epoch with precision=auto train.channels_last=auto: what the probe picks here
#   headline  (LIMIT_HEADLINE=160):  the shipped recipes side by side (fashion-fast, fashion-sprint, fashion-94)
#   nccl      (LIMIT_NCCL=40):       fashion-fast for 2 epochs data-parallel over every GPU, NCCL (torchrun)
# (On an H200: tests 44-50 s, precision about 145 s, auto 15 s, headline 142 s, nccl 21 s; docs/results/gpu-h200.md.)
# SMOKE="data.subset=512 data.test_subset=256" adds overrides to every run, and ALLOW_CPU=1 accepts a torch without
# CUDA: together, a minute-long check of the script itself on a CPU machine (the numbers mean nothing there).
# Results: $OUT (default bench/gpu)/<phase>/ (report.md, results.csv/json, plots) and $OUT/README.md, which
# gathers the reports: commit that file.
# GAN=1 also runs the DCGAN in fp32, bf16 and fp16 (per-network loss scaling) on the shipped dcgan-fashion
# recipe's full budget (GAN_ARGS, default 4 epochs of all 60,000 images), cut off after GAN_LIMIT seconds
# (default 900): speed, memory, Fréchet and class mix in $OUT/gan (docs/gan.md).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench/gpu}
SITE=${SITE:-.gpu-site}

has_cuda_torch() {
  "$1" -c 'import os, torch, sys; sys.exit(0 if torch.cuda.is_available() or os.environ.get("ALLOW_CPU") else 1)' \
    2>/dev/null
}
SMOKE=${SMOKE:-}

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
try:
    metadata.version("pytest")
except metadata.PackageNotFoundError:
    missing.append("pytest>=8")  # the tests phase
print(" ".join(missing))
EOF
)
if [ -n "$missing" ]; then
  echo "installing into $SITE: $missing"
  mkdir -p "$SITE"
  if [ -n "${HASTEN_WHEELS:-}" ]; then
    "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$HASTEN_WHEELS"/*.whl
  else
        "$PY" -m pip install --quiet --target "$SITE" $missing
  fi
fi

"$PY" - <<'EOF'
import torch

if torch.cuda.is_available():
    print(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, "
        f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}"
    )
else:
    print(f"torch {torch.__version__}: no GPU (ALLOW_CPU=1: a check of this script, not a measurement)")
EOF
"$PY" -m hasten data fetch fashion-mnist

# $SMOKE is split into its overrides on purpose
# shellcheck disable=SC2086
mkdir -p "$OUT"
GPUS=$("$PY" -c 'import torch; print(max(torch.cuda.device_count(), 1))')
phase() {  # phase NAME LIMIT COMMAND...: run it, cut off after LIMIT seconds; a failure does not stop the script
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit} s): $*"
  local started=$SECONDS code=0
  timeout --signal=INT --kill-after=20 "$limit" "$@" || code=$?
  echo "$name: exit $code after $((SECONDS - started)) s" | tee -a "$OUT/phases.txt"
}
: > "$OUT/phases.txt"
phase tests "${LIMIT_TESTS:-60}" "$PY" -m pytest -q -p no:cacheprovider -m "cuda or machine" tests \
  --junitxml "$OUT/tests.xml"
phase precision "${LIMIT_PRECISION:-160}" "$PY" -m hasten bench fashion-fast train.epochs=3 $SMOKE \
  --vary precision=fp32,bf16,fp16,fp16-master --repeats 1 --no-naive --out "$OUT/precision"
phase layout "${LIMIT_LAYOUT:-110}" "$PY" -m hasten bench fashion-fast precision=bf16 train.channels_last=true \
  train.epochs=2 $SMOKE --vary train.compile=false,true --repeats 1 --no-naive --no-warmup --out "$OUT/layout"
phase auto "${LIMIT_AUTO:-30}" "$PY" -m hasten train fashion-fast precision=auto train.channels_last=auto \
  train.epochs=1 $SMOKE run.progress=false run.overwrite=true "run.dir=$OUT/auto"
phase headline "${LIMIT_HEADLINE:-160}" "$PY" -m hasten bench fashion-fast --also fashion-sprint --also fashion-94 $SMOKE \
  --repeats 1 --naive-epochs 2 --out "$OUT/headline"
phase nccl "${LIMIT_NCCL:-40}" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" -m hasten train \
  fashion-fast train.epochs=2 $SMOKE run.progress=false run.overwrite=true "run.dir=$OUT/nccl"

{
  echo "# hasten on $("$PY" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU")') ($GPUS GPU(s))"
  echo
  echo "\`bash benchmarks/gpu.sh\`, $(date -u +%Y-%m-%dT%H:%MZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
  echo '```'
  cat "$OUT/phases.txt"
  echo '```'
  if [ -f "$OUT/tests.xml" ]; then
    echo; echo "## tests (cuda or machine)"; echo
    "$PY" -c "import sys, xml.etree.ElementTree as E; r=E.parse(sys.argv[1]).getroot(); s=r if r.tag=='testsuite' else r[0]; print({k: s.get(k) for k in ('tests', 'failures', 'errors', 'skipped')})" "$OUT/tests.xml"
  fi
  for name in precision layout headline; do
    [ -f "$OUT/$name/report.md" ] && { echo; echo "## $name"; echo; sed 's/^#/##/' "$OUT/$name/report.md"; }
  done
  for name in auto nccl; do
    if [ -f "$OUT/$name/summary.json" ]; then
      echo; echo "## $name"; echo; echo '```'
      grep -E '^(precision|  channels_last|  batch_size):' "$OUT/$name/recipe.yaml" || true
      "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: s.get(k) for k in ('test_accuracy', 'train_seconds', 'images_per_second', 'world_size', 'precision', 'channels_last')})" "$OUT/$name/summary.json"
      echo '```'
    fi
  done
} > "$OUT/README.md"
echo "report: $OUT/README.md"
if [ "${GAN:-0}" = 1 ]; then
  set -x
    timeout --signal=INT "${GAN_LIMIT:-900}" "$PY" benchmarks/gan.py --out "$OUT/gan" --max-train-seconds 100000 \
    ${GAN_ARGS:---epochs 4 --subset 60000}
  set +x
  echo "DCGAN report: $OUT/gan/report.md"
fi
