set -uo pipefail
STEPS=build bash tools/device_check.sh > $OUT/build_summary.txt 2>&1 || { cat $OUT/build_summary.txt; exit 1; }
grep "clean build" $OUT/build_summary.txt
pytest -q -rfE tests/python 2>&1 | tee $OUT/pytest.log | tail -8
python3 benchmarks/bench_host_overhead.py 2>&1 | tee $OUT/bench_host.log
compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 pytest -q -x -k "cuda and not large and not memory" tests/python/test_quantize_current_scaling.py tests/python/test_module_ops.py tests/python/test_rope.py tests/python/test_attention.py tests/python/test_multi_head_attention.py tests/python/test_transformer_layer.py tests/python/test_softmax.py > $OUT/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1) $(tail -1 $OUT/memcheck.log)"
