"""te.LayerNorm / te.RMSNorm over several trailing dims (a normalized_shape of more than one
dim, as torch.nn.LayerNorm's): parameters of that shape, forward and gradients against
torch.nn.functional.layer_norm / rms_norm in fp32."""

import pytest
import torch
import torch.nn.functional as F
from conftest import requires_cuda

import transformer_engine.pytorch as te

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
# fp32: Transformer Engine's test tolerances, x4 for the sums over rows of the parameter
# gradients (summed in another order than PyTorch's). bf16: one bf16 rounding (2^-8) of
# the result; dx and the parameter gradients are sums of terms as large as the largest
# element, so their error is that rounding of the largest element.
TOLS = {torch.float32: dict(rtol=1.3e-6 * 4, atol=1e-5 * 4), torch.bfloat16: dict(rtol=1.6e-2, atol=None)}


def reference(cls, x, shape, weight, bias, eps, zero_centered_gamma):
    gamma = weight + 1 if zero_centered_gamma else weight
    if cls is te.LayerNorm:
        return F.layer_norm(x, shape, gamma, bias, eps)
    return F.rms_norm(x, shape, gamma, eps)


def assert_close(got, want, dtype):
    tol = dict(TOLS[dtype])
    if tol["atol"] is None:
        tol["atol"] = 2**-7 * want.abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cls", [te.LayerNorm, te.RMSNorm], ids=["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 17), (1, 33)], ids=["6x16", "2x3x17", "1x33"])
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zc_gamma"])
def test_matches_torch_over_several_dims(device, dtype, cls, shape, zero_centered_gamma):
    torch.manual_seed(31)
    m = cls(shape, eps=1e-5, params_dtype=dtype, zero_centered_gamma=zero_centered_gamma, device=device)
    assert m.weight.shape == shape and (m.bias is None or m.bias.shape == shape)
    with torch.no_grad():
        m.weight.normal_(0.0 if zero_centered_gamma else 1.0, 0.1)
        if m.bias is not None:
            m.bias.normal_()
    x = torch.randn(4, 5, *shape, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn_like(x)
    params = [x, m.weight] + ([m.bias] if m.bias is not None else [])
    y = m(x)
    assert y.shape == x.shape and y.dtype == dtype
    ref_params = [p.detach().float().requires_grad_() for p in params]
    y_ref = reference(cls, ref_params[0], shape, ref_params[1], ref_params[2] if m.bias is not None else None, 1e-5,
                      zero_centered_gamma)
    assert_close(y, y_ref, dtype)
    got = torch.autograd.grad(y, params, g)
    want = torch.autograd.grad(y_ref, ref_params, g.float())
    for a, b, p in zip(got, want, params):
        assert a.shape == p.shape
        assert_close(a, b, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_spellings_of_the_shape(device):
    for spelling in ((4, 8), [4, 8], torch.Size([4, 8])):
        assert te.LayerNorm(spelling, device=device).weight.shape == (4, 8)
        assert te.RMSNorm(3, normalized_shape=spelling, device=device).weight.shape == (4, 8)
    one = te.LayerNorm((32,), device=device)  # one dim: as the int
    assert one.weight.shape == (32,) and one.hidden_size == 32
    two = te.LayerNorm((4, 8), device=device)
    assert two.normalized_shape == (4, 8) and two.hidden_size == 32
    assert "(4, 8)" in repr(two)


@pytest.mark.parametrize("device", DEVICES)
def test_loads_torch_layernorm_state(device):
    torch.manual_seed(32)
    ref = torch.nn.LayerNorm((3, 16), device=device)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.1)
        ref.bias.normal_()
    m = te.LayerNorm((3, 16), device=device)
    m.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 3, 16, device=device)
    torch.testing.assert_close(m(x), ref(x), **TOLS[torch.float32])


def test_errors():
    m = te.LayerNorm((4, 8), device="cpu")
    with pytest.raises(ValueError, match=r"trailing dimensions must be normalized_shape=\(4, 8\), got shape "
                                         r"\(2, 8, 8\)"):
        m(torch.randn(2, 8, 8))
    with pytest.raises(ValueError, match="normalized_shape\\[-1\\]=8"):
        m(torch.randn(2, 4, 7))
    with pytest.raises(ValueError, match="trailing dimensions"):
        m(torch.randn(8))  # fewer dims than normalized over
    for bad in ((), (4, 0), (4, -1), (4, 2.0), (True, 4)):
        with pytest.raises(ValueError, match="hidden_size must be a positive int, or a non-empty sequence"):
            te.RMSNorm(bad, device="cpu")
