#!/usr/bin/env bash
# Downloads the nvidia-cudnn-frontend wheel (cudnn-frontend's C++ headers are in its
# include/) for the lent GPU machine's Python 3.12 into .whl/ (ignored by git), to
# carry there: the build finds the headers in that wheel by itself
# (cmake/opente_cudnn.cmake), or from PYTHONPATH after
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
#
#   bash tools/fetch_cudnn_frontend.sh [VERSION]      # default 1.32.0; PYTHON_VERSION=3.12
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-1.32.0}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
mkdir -p .whl
rm -f .whl/nvidia_cudnn_frontend-*.whl
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "nvidia-cudnn-frontend==$VERSION"
ls -l .whl/nvidia_cudnn_frontend-*.whl
