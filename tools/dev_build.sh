#!/usr/bin/env bash
# Fast local build for development: the core and the binding, built with CMake
# into build/local and installed next to the Python sources (transformer_engine/_core*.so),
# so that `PYTHONPATH=$PWD pytest tests/python` runs this tree without pip.
# Several checkouts (git worktrees) can each have their own this way.
#   OPENTE_CUDA=OFF|ON|AUTO (default OFF: the CPU build is the quick one)
#   OPENTE_BUILD_TESTS=ON also builds the GoogleTest suite (then: ctest --test-dir build/local)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build/local -G Ninja -DOPENTE_BUILD_PYTHON=ON \
  -DOPENTE_CUDA="${OPENTE_CUDA:-OFF}" -DOPENTE_BUILD_TESTS="${OPENTE_BUILD_TESTS:-OFF}" \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build/local
cmake --install build/local --prefix . >/dev/null
