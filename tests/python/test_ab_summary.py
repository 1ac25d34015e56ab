"""tools/ab_summary.py: device_ab.sh's interleaved bandwidth tables, one line an op and shape."""

from __future__ import annotations

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("ab_summary", os.path.join(ROOT, "tools", "ab_summary.py"))
ab_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_summary)

# two rounds of base and one patch, as device_ab.sh prefixes print_bandwidth_table's lines,
# with the lines around them that are not results (build notes, the header, pytest)
OUTPUT = """== base built in 110 s
== x.patch built in 61 s
[x.patch] 458 passed, 8 skipped in 80.12s
== round 1
[base] device: NVIDIA H200  copy bandwidth (read+write, 1 GiB): 4230 GB/s
[base] | op | rows x hidden (bf16) | OpenTE us | GB/s | of copy BW | of a same-bytes copy | PyTorch us | speed-up |
[base] |---|---|---|---|---|---|---|---|
[base] | layernorm bwd | 8192 x 5120 | 90.0 | 2796 | 66.1% | 70.0% | 200.0 | 2.22x |
[base] | rmsnorm bwd | 8192 x 5120 | 80.0 | 3173 | 75.0% | 81.0% | 190.0 | 2.40x |
[x.patch] device: NVIDIA H200  copy bandwidth (read+write, 1 GiB): 4232 GB/s
[x.patch] | op | rows x hidden (bf16) | OpenTE us | GB/s | of copy BW | of a same-bytes copy | PyTorch us | speed-up |
[x.patch] |---|---|---|---|---|---|---|---|
[x.patch] | layernorm bwd | 8192 x 5120 | 80.0 | 3146 | 74.4% | 79.0% | 200.0 | 2.50x |
[x.patch] | rmsnorm bwd | 8192 x 5120 | 80.0 | 3226 | 76.3% | 81.0% | 190.0 | 2.44x |
== round 2
[base] | layernorm bwd | 8192 x 5120 | 92.0 | 2796 | 66.1% | 68.0% | 200.0 | 2.22x |
[base] | rmsnorm bwd | 8192 x 5120 | 80.0 | 3173 | 75.0% | 81.0% | 190.0 | 2.40x |
[x.patch] | layernorm bwd | 8192 x 5120 | 82.0 | 3146 | 74.4% | 77.0% | 200.0 | 2.50x |
"""


def test_medians_and_ratios_a_line_an_op_and_shape():
    variants, times = ab_summary.collect(OUTPUT.splitlines())
    assert variants == ["base", "x.patch"]
    assert times[("layernorm bwd", "8192 x 5120", "rows x hidden (bf16)")]["base"] == [(90.0, 70.0), (92.0, 68.0)]
    lines = ab_summary.table(variants, times)
    assert lines[0] == "| op | shape | base us (of a same-bytes copy) | x.patch |"
    assert lines[2] == "| layernorm bwd | 8192 x 5120 | 91.0 (69.0%) | 81.0 (78.0%), 0.890x |"
    # a variant with one round of an op: its median is that round
    assert lines[3] == "| rmsnorm bwd | 8192 x 5120 | 80.0 (81.0%) | 80.0 (81.0%), 1.000x |"
    assert len(lines) == 4


def test_output_without_a_base_is_refused():
    variants, times = ab_summary.collect([line.replace("[base]", "[other]") for line in OUTPUT.splitlines()])
    with pytest.raises(SystemExit, match="base"):
        ab_summary.table(variants, times)


def test_the_same_shape_under_two_tables_keeps_two_lines():
    """A command that runs the benchmark twice (bf16, then fp32 weights) at one shape: a
    line for each table, the shape labelled with the header's words, medians not mixed."""
    second = [line.replace("rows x hidden (bf16)", "rows x hidden (bf16, fp32 weights)")
              .replace("| 90.0 |", "| 99.0 |").replace("| 92.0 |", "| 99.0 |")
              for line in OUTPUT.splitlines()]
    variants, times = ab_summary.collect(OUTPUT.splitlines() + second)
    lines = ab_summary.table(variants, times)
    assert lines[2] == "| layernorm bwd | 8192 x 5120 (bf16) | 91.0 (69.0%) | 81.0 (78.0%), 0.890x |"
    assert "| layernorm bwd | 8192 x 5120 (bf16, fp32 weights) | 99.0 (69.0%) | 81.0 (78.0%), 0.818x |" in lines
    assert len(lines) == 6


def test_rounds_apart_from_the_base_and_their_spread():
    """layernorm: x.patch's rounds (80, 82) all below the base's (90, 92); rmsnorm: one
    x.patch round of 80 against the base's two of 80, which overlap. The spreads: 2 us for
    each (layernorm's rounds), 0 where a variant has one round."""
    variants, times = ab_summary.collect(OUTPUT.splitlines())
    key = ("layernorm bwd", "8192 x 5120", "rows x hidden (bf16)")
    assert ab_summary.rounds_apart(times[key]["base"], times[key]["x.patch"]) == -1
    assert ab_summary.rounds_apart(times[key]["x.patch"], times[key]["base"]) == 1
    rms = ("rmsnorm bwd", "8192 x 5120", "rows x hidden (bf16)")
    assert ab_summary.rounds_apart(times[rms]["base"], times[rms]["x.patch"]) == 0
    assert ab_summary.rounds_apart(times[rms]["base"], []) == 0
    assert ab_summary.apart(variants, times) == [
        "x.patch: every round faster than every base round at 1 of 2 lines, slower at 0; "
        "the largest spread between one line's rounds 2.0 us (base 2.0 us)"]
