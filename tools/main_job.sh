#!/usr/bin/env bash
# The main job (README): install what is missing, build OpenTE, then train a small GPT
# built from transformer_engine.pytorch modules in BF16 and then in FP8 on the GPU if
# there is one, else a tiny configuration on the CPU. Results (loss_curves.png,
# results.md) go to ./results, or to the folder given with --out.
#   bash tools/main_job.sh [--config gpu|tiny] [--steps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what is missing is installed, so this also runs where no registry is reachable
# but everything is present (the lent GPU machine).
missing=()
$PY -c "import torch" 2>/dev/null || missing+=("torch==2.11.*")
$PY -c "import scikit_build_core" 2>/dev/null || missing+=("scikit-build-core>=0.10")
$PY -c "import nanobind" 2>/dev/null || missing+=("nanobind>=2.4")
command -v cmake >/dev/null || missing+=("cmake>=3.24")
command -v ninja >/dev/null || missing+=(ninja)
$PY -c "import numpy" 2>/dev/null || missing+=(numpy)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  $PY -m pip install -q "${missing[@]}"
fi

echo "== build (pip install .)"
SECONDS=0
$PY -m pip install -q --no-build-isolation --no-deps . -C build-dir=build/main_job
echo "== build took ${SECONDS} s"

echo "== training"
# The script's own folder goes first on sys.path, not the source tree: the installed
# package (with its compiled core) is the one imported.
$PY examples/train_gpt.py "$@"
