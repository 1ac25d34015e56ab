#!/usr/bin/env bash
# Everything the lent GPU machine checks, in one call (see README, "GPU tests"):
# a clean build with all cores, the test suites on CUDA, the benchmarks, and
# compute-sanitizer (memcheck, racecheck) over the GPU tests: those named *cuda*, and
# all of test_fused_attn.py (its cuDNN tests' names lack "cuda"); all but the
# *_cuda_large ones and the exhaustive GEMM matrices, which take minutes under
# the sanitizer; and the *memory* tests, whose allocator accounting differs under
# the sanitizer). Logs go to $OUT.
#
#   run(command="bash tools/device_check.sh")            # from the device tool
#   STEPS="build tests" bash tools/device_check.sh       # a subset
#   TESTS="tests/python/test_normalization.py tests/python/test_norm_normalized_shape.py" \
#     STEPS="build tests" bash tools/device_check.sh     # some test files (default: all of tests/python)
#   TESTS_SHARD=1/2 STEPS="build tests" bash tools/device_check.sh   # half the suite (then 2/2 in a
#                                                        # second call): the whole of it with a build
#                                                        # outgrew one call (520 s reached 96%, H100)
#   STEPS="build host" bash tools/device_check.sh        # host-time benchmarks only
#   SANITIZE_FILES="tests/python/test_gemm.py" STEPS=sanitizer bash tools/device_check.sh
#   SANITIZE_TOOLS=racecheck SANITIZE_SHARD=2/3 STEPS=sanitizer bash tools/device_check.sh  # a third of it
#   PROFILE_KERNELS=norm_fwd_rows_kernel PROFILE_BENCH="benchmarks/bench_norm.py --iters 1 --shapes 4096x16384" \
#     STEPS=profile bash tools/device_check.sh
#   PROFILE_KERNELS=softmax_fwd_rows_kernel STEPS="build profile" \
#     PROFILE_BENCH="benchmarks/bench_softmax.py --iters 1 --ops masked --shapes 2x16x512x2047" \
#     bash tools/device_check.sh      # then: python3 tools/ncu_sass.py ncu_softmax_fwd_rows_kernel.sass.csv
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/opente_device}
STEPS=${STEPS:-"build tests bench sanitizer"}  # also: profile (ncu; default: the cast kernels), host
JOBS=$(nproc)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
status=0
step() { [[ " $STEPS " == *" $1 "* ]]; }
note() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# Carried wheels (.whl/, e.g. nvidia-cudnn-frontend from tools/fetch_cudnn_frontend.sh: the GPU
# machine has no registry): installed aside, so the build finds the frontend headers and the
# fused attention backend is built. Name .whl in the device tool's carry.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if step build; then
  rm -rf build/device
  SECONDS=0
  # the C++ tests are CPU-only (CI runs them); the GPU machine builds core + binding
  if python3 -m pip install --no-build-isolation --no-deps -v . -C build-dir=build/device >"$OUT/build.log" 2>&1; then
    note "clean build ($JOBS cores): ${SECONDS} s"
  else
    note "BUILD FAILED (see build.log)"; tail -30 "$OUT/build.log"; exit 1
  fi
  (cd / && python3 -c "from transformer_engine import _core; print(_core.__file__, 'built_with_cuda', _core.built_with_cuda())")
  note "$(grep -m1 -o 'cuDNN fused attention [A-Z]*' "$OUT/build.log" || echo 'cuDNN fused attention: not reported')"
  note "compiler: $(grep -m1 -E 'The CXX compiler identification' "$OUT/build.log" || c++ --version | head -1)"
  # where the build's time went: its longest files, and its compile steps on these cores
  if [ -f build/device/.ninja_log ]; then
    python3 tools/build_times.py build/device/.ninja_log --cores "$JOBS" --longest 5 | tee -a "$OUT/summary.txt"
  fi
fi

if step tests; then
  # pytest, not python -m pytest: the installed package, not the source tree
  # --durations: where the suite's minutes go (about 6 on an H100 in the forty-seventh
  # session), for the next trim; TESTS picks files (pytest's arguments), so that a
  # landing's own files fit a call beside its build; TESTS_SHARD=K/N: every N-th test from
  # the K-th (tests/python/conftest.py's --shard)
  # shellcheck disable=SC2086  # TESTS is a list of paths
  pytest -q -rs --durations=30 ${TESTS_SHARD:+--shard "$TESTS_SHARD"} ${TESTS:-tests/python} 2>&1 |
    tee "$OUT/pytest.log" | tail -15
  rc=${PIPESTATUS[0]}
  note "pytest: $(tail -1 "$OUT/pytest.log")"; [ "$rc" = 0 ] || status=1
fi

if step bench; then
  for bench in benchmarks/bench_*.py; do
    name=$(basename "$bench" .py)
    python3 "$bench" 2>&1 | tee "$OUT/$name.log"
  done
fi

if step host; then
  # The host-time benchmarks alone (also part of "bench"): the modules' tiny steps against
  # PyTorch's, and bench_modules.py's training steps with its own host line, in one call.
  for bench in bench_host_overhead bench_modules; do
    python3 "benchmarks/$bench.py" 2>&1 | tee "$OUT/$bench.log" | grep -E '^\||^device'
  done
fi

if step profile; then
  # PROFILE_KERNELS (kernel base names) under PROFILE_BENCH (a benchmark and its arguments).
  # Each report's source page too (ncu_<kernel>.sass.csv: every SASS line's executed count
  # and stall samples), which tools/ncu_sass.py reads.
  for kernel in ${PROFILE_KERNELS:-cast_kernel cast_transpose_kernel dequantize_kernel amax_kernel}; do
    # shellcheck disable=SC2086  # PROFILE_BENCH is a command line
    ncu --clock-control none --kernel-name "$kernel" --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
      --section SourceCounters -f -o "/tmp/ncu_$kernel" \
      python3 ${PROFILE_BENCH:-benchmarks/bench_quantize.py --iters 1 --shapes 8192x8192} >"$OUT/ncu_$kernel.run.log" 2>&1
    ncu -i "/tmp/ncu_$kernel.ncu-rep" --page details >"$OUT/ncu_$kernel.log" 2>&1
    ncu -i "/tmp/ncu_$kernel.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_$kernel.sass.csv" 2>&1
    note "ncu $kernel: $(grep -E '^ +(Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per Thread) ' "$OUT/ncu_$kernel.log" | tr -s ' ' | tr '\n' ';')"
  done
fi

if step sanitizer; then
  # SANITIZE_TOOLS: one of them alone (a racecheck cut off by a call's limit, again);
  # SANITIZE_SHARD=K/N: every N-th selected test from the K-th (--shard, as TESTS_SHARD), for
  # a run longer than one call (the sixty-sixth session's racecheck of the forward's tests,
  # 1446 of them, stopped at 96% after five minutes, its last 58 tests all of one function)
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    # shellcheck disable=SC2086  # SANITIZE_FILES is a list of paths
    compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
      pytest -q -x ${SANITIZE_SHARD:+--shard "$SANITIZE_SHARD"} \
      -k "${SANITIZE_K:-(cuda or fused_attn) and not large and not memory}" -m "not exhaustive and not child_process" \
      ${SANITIZE_FILES:-tests/python} >"$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    note "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1) | $(grep -E 'passed|failed' "$OUT/sanitizer_$tool.log" | tail -1)"
    [ "$rc" = 0 ] || status=1
  done
fi

cat "$OUT/summary.txt"
exit $status
