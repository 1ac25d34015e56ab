"""tools/norm_bwd_same_bits.py's comparison, on made-up cases (the tool itself needs a GPU):
bits, not values, decide; a case missing or of another length, dtype or shape differs."""

import importlib.util
import pathlib

import torch

_PATH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "norm_bwd_same_bits.py"
_SPEC = importlib.util.spec_from_file_location("norm_bwd_same_bits", _PATH)
norm_bwd_same_bits = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(norm_bwd_same_bits)


def test_the_same_bits_pass_and_nans_equal_themselves():
    sums = [torch.tensor([1.0, float("nan"), -0.0]), torch.tensor([2.0], dtype=torch.bfloat16)]
    assert norm_bwd_same_bits.differing({"a": sums}, {"a": [t.clone() for t in sums]}) == []


def test_one_bit_off_is_named():
    before = torch.tensor([1.0, 2.0, 3.0])
    now = before.clone()
    now.view(torch.int32)[1] += 1  # the next float after 2.0
    assert norm_bwd_same_bits.differing({"a": [now], "b": [before]}, {"a": [before], "b": [before]}) == ["a"]


def test_signed_zeros_differ():
    # equal as values, not as bits
    assert norm_bwd_same_bits.differing({"a": [torch.tensor([-0.0])]}, {"a": [torch.tensor([0.0])]}) == ["a"]


def test_missing_cases_and_other_lengths_dtypes_or_shapes_differ():
    x = torch.zeros(4)
    before = {"b": [x], "c": [x], "d": [x]}
    now = {"a": [x], "b": [x, x], "c": [x.to(torch.float64)], "d": [x.reshape(2, 2)]}
    assert norm_bwd_same_bits.differing(now, before) == ["a", "b", "c", "d"]
