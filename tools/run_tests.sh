#!/usr/bin/env bash
# The test command (README): on a fresh machine, install what the build and the
# tests need, build OpenTE once (core, binding and C++ tests in one CMake tree),
# then run the C++ tests (ctest) and the Python tests (pytest). GPU tests skip
# without a GPU. Works on Debian-like machines with Python >= 3.10.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
BUILD_DIR=build/tests

# GoogleTest for the C++ tests, from Debian's packages when missing.
if ! [ -f /usr/include/gtest/gtest.h ]; then
  (apt-get update -qq && apt-get install -y -qq libgtest-dev) >/dev/null
fi
# Build and test requirements from PyPI (torch 2.11 matches the GPU machine).
$PY -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" "cmake>=3.24" ninja numpy pytest "torch==2.11.*" \
  lightning accelerate  # the real clients tests/python/test_clients.py runs
# cuobjdump and nvdisasm (the toolkit here has nvcc only): tests/python/test_kernel_sass.py
$PY -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm

echo "== build (pip install ., with the C++ tests)"
SECONDS=0
$PY -m pip install -q --no-build-isolation --no-deps . -C build-dir="$BUILD_DIR" -C cmake.define.OPENTE_BUILD_TESTS=ON
(cd / && $PY -c "import transformer_engine as te; from transformer_engine import _core
print('transformer_engine', te.__version__, '| CUDA kernels:', _core.built_with_cuda())")
echo "== build took ${SECONDS} s"

echo "== C++ tests (ctest)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"

echo "== Python tests (pytest)"
# The pytest script, not `python -m pytest`: the source tree must not shadow the
# installed package (it has no compiled _core).
pytest -q -rs tests/python

# The CPU build again under AddressSanitizer and UndefinedBehaviorSanitizer, and the
# tests against it: no CPU path reads or writes out of bounds on any input above.
bash tools/cpu_sanitizers.sh
