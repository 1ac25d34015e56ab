"""tools/norm_kernel_times.py's arithmetic, on made-up kernel events (the tool itself needs a
GPU): medians and launches a call by kernel, and a call's kernel time from them."""

import importlib.util
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "norm_kernel_times.py"
_SPEC = importlib.util.spec_from_file_location("norm_kernel_times", _PATH)
norm_kernel_times = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(norm_kernel_times)


def test_medians_and_launches_a_call():
    # three calls: a rows kernel each, a finalize each, and a transpose in two of them
    events = [("rows", 30.0), ("finalize", 2.0), ("rows", 32.0), ("finalize", 4.0), ("transpose", 5.0),
              ("rows", 31.0), ("finalize", 3.0), ("transpose", 7.0)]
    medians = norm_kernel_times.kernel_medians(events, calls=3)
    assert list(medians) == ["rows", "finalize", "transpose"]  # first appearance
    assert medians["rows"] == (31.0, 1.0)
    assert medians["finalize"] == (3.0, 1.0)
    assert medians["transpose"] == (6.0, pytest.approx(2 / 3))
    assert norm_kernel_times.op_kernel_us(medians) == pytest.approx(31.0 + 3.0 + 6.0 * 2 / 3)


def test_short_name_keeps_short_names_and_cuts_long_ones():
    assert norm_kernel_times.short_name("norm_bwd_finalize_kernel<32>") == "norm_bwd_finalize_kernel<32>"
    cut = norm_kernel_times.short_name("k" * 100, width=20)
    assert len(cut) == 20 and cut.endswith("...")
