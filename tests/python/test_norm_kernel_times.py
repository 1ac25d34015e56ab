"""tools/norm_kernel_times.py's arithmetic, on made-up kernel events (the tool itself needs a
GPU): events split into calls, a call's span and each kernel's share of it where a
dependent kernel starts before the kernel it waits on has ended, and medians over calls."""

import importlib.util
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "norm_kernel_times.py"
_SPEC = importlib.util.spec_from_file_location("norm_kernel_times", _PATH)
norm_kernel_times = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(norm_kernel_times)


def test_calls_split_in_start_order():
    # two calls of a rows kernel and a finalize, the events out of order
    events = [("finalize", 12.0, 45.0), ("rows", 10.0, 40.0), ("rows", 50.0, 81.0), ("finalize", 51.0, 84.0)]
    timelines = norm_kernel_times.call_timelines(events, calls=2)
    assert [[name for name, _, _ in t] for t in timelines] == [["rows", "finalize"]] * 2
    assert timelines[1][0] == ("rows", 50.0, 81.0)


def test_calls_that_differ_or_do_not_split_are_refused():
    with pytest.raises(ValueError, match="split"):
        norm_kernel_times.call_timelines([("rows", 0.0, 1.0)] * 3, calls=2)
    with pytest.raises(ValueError, match="same kernels"):
        norm_kernel_times.call_timelines([("rows", 0.0, 1.0), ("finalize", 2.0, 3.0),
                                          ("finalize", 4.0, 5.0), ("rows", 6.0, 7.0)], calls=2)


def test_a_dependent_kernel_is_charged_its_end_past_the_kernel_before():
    # the finalize starts 2 us into the rows kernel (a programmatic dependent launch) and ends
    # 5 us after it: it runs 33 us, yet adds 5 us to the call's 35
    span, shares = norm_kernel_times.call_span_and_shares([("rows", 10.0, 40.0), ("finalize", 12.0, 45.0)])
    assert span == pytest.approx(35.0)
    assert shares == [("rows", 30.0, 30.0), ("finalize", 33.0, 5.0)]
    assert sum(share for _, _, share in shares) == pytest.approx(span)


def test_a_gap_between_kernels_is_charged_to_the_later_one():
    span, shares = norm_kernel_times.call_span_and_shares([("cast", 0.0, 4.0), ("transpose", 6.0, 9.0)])
    assert span == pytest.approx(9.0)
    assert shares[1] == ("transpose", 3.0, 5.0)


def test_median_call_takes_each_kernels_median():
    events = [("rows", 0.0, 30.0), ("finalize", 1.0, 32.0),
              ("rows", 100.0, 132.0), ("finalize", 101.0, 136.0),
              ("rows", 200.0, 231.0), ("finalize", 201.0, 234.0)]
    span, kernels = norm_kernel_times.median_call(events, calls=3)
    assert span == pytest.approx(34.0)  # spans 32, 36, 34
    assert kernels == [("rows", 31.0, 31.0), ("finalize", 33.0, 3.0)]  # shares 2, 4, 3


def test_short_name_keeps_short_names_and_cuts_long_ones():
    assert norm_kernel_times.short_name("norm_bwd_finalize_kernel<32>") == "norm_bwd_finalize_kernel<32>"
    cut = norm_kernel_times.short_name("k" * 100, width=20)
    assert len(cut) == 20 and cut.endswith("...")
