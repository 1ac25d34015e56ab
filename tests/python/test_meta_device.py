"""device="meta" (deferred init): modules built without memory, then materialized with
``to_empty(device=...)`` and ``reset_parameters()``, must equal the same modules built
directly on that device from the same RNG seed (bit for bit: the same init calls on the
same generator), and train the same."""

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def scaled_init(weight):
    torch.nn.init.uniform_(weight, -0.1, 0.1)


# name: (constructor, input's last dim)
MODULES = {
    "Linear": (lambda device: te.Linear(64, 48, device=device), 64),
    "Linear_split": (lambda device: te.Linear(64, 48, parameters_split=("query_", "key_", "value_"),
                                              init_method=scaled_init, device=device), 64),
    "Linear_nobias": (lambda device: te.Linear(64, 48, bias=False, params_dtype=torch.bfloat16, device=device), 64),
    "LayerNormLinear": (lambda device: te.LayerNormLinear(64, 48, device=device), 64),
    "LayerNormLinear_rms": (lambda device: te.LayerNormLinear(64, 48, normalization="RMSNorm",
                                                              zero_centered_gamma=True, device=device), 64),
    "LayerNormMLP": (lambda device: te.LayerNormMLP(64, 96, device=device), 64),
    "LayerNormMLP_swiglu": (lambda device: te.LayerNormMLP(64, 96, activation="swiglu", normalization="RMSNorm",
                                                           output_layer_init_method=scaled_init, device=device), 64),
    "LayerNorm": (lambda device: te.LayerNorm(64, device=device), 64),
    "RMSNorm": (lambda device: te.RMSNorm(64, zero_centered_gamma=True, device=device), 64),
    "TransformerLayer": (lambda device: te.TransformerLayer(
        64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, layer_type="decoder", qk_norm_type="RMSNorm",
        softmax_type="learnable", device=device), 64),
    "TransformerLayer_post_ln": (lambda device: te.TransformerLayer(
        64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, output_layernorm=True, fuse_qkv_params=True,
        normalization="RMSNorm", device=device), 64),
}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def materialize(module, device, seed):
    """What clients do with a meta model (torch FSDP, accelerate): to_empty, then every
    submodule's own reset_parameters, in module order."""
    module.to_empty(device=device)
    with torch.no_grad():  # the memory to_empty gives is garbage: make it show if left
        for p in module.parameters():
            p.fill_(float("nan"))
    torch.manual_seed(seed)
    for m in module.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return module


def run(module, x, is_decoder):
    x = x.detach().clone().requires_grad_()
    y = module(x, encoder_output=x.detach()) if is_decoder else module(x)
    y.square().sum().backward()
    return y, x.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(MODULES))
def test_meta_then_reset_equals_direct(device, name):
    make, hidden = MODULES[name]
    lazy = make("meta")
    params = list(lazy.named_parameters())
    assert params and all(p.is_meta for _, p in params)
    assert all(b.is_meta for b in lazy.buffers())
    if isinstance(lazy, te.Linear):  # no FP8 metadata yet: it is made on the first FP8 forward
        assert lazy.get_extra_state() == {}
    materialize(lazy, device, seed=21)
    torch.manual_seed(21)
    direct = make(device)
    lazy_params = dict(lazy.named_parameters())
    assert list(lazy_params) == [n for n, _ in direct.named_parameters()]
    for n, p in direct.named_parameters():
        assert lazy_params[n].device == p.device and lazy_params[n].dtype == p.dtype, n
        assert torch.equal(lazy_params[n], p), n
    dtype = next(direct.parameters()).dtype
    x = torch.randn(8, 2, hidden, device=device, dtype=dtype)
    is_decoder = "TransformerLayer" in name and direct.layer_type == "decoder"
    y_lazy, dx_lazy = run(lazy, x, is_decoder)
    y_direct, dx_direct = run(direct, x, is_decoder)
    assert torch.equal(y_lazy, y_direct) and torch.equal(dx_lazy, dx_direct)
    for n, p in direct.named_parameters():
        assert torch.equal(lazy_params[n].grad, p.grad), n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_meta_module_trains_in_fp8(device, name):
    # FP8 metadata (delayed scaling) is made on the first FP8 forward, on the input's
    # device: nothing of it was made on meta.
    make, hidden = MODULES[name]
    lazy = materialize(make("meta"), device, seed=22)
    torch.manual_seed(22)
    direct = make(device)
    recipe = DelayedScaling(amax_history_len=3)
    for step in range(3):
        x = torch.randn(16, hidden, device=device)
        outs = []
        for m in (lazy, direct):
            with te.fp8_autocast(fp8_recipe=recipe):
                y = m(x)
            y.sum().backward()
            outs.append(y)
        assert torch.equal(outs[0], outs[1]), step
    assert lazy._fwd_state.scale.device.type == device
    assert torch.equal(lazy._fwd_state.amax_history, direct._fwd_state.amax_history)
    for (n, p), (_, q) in zip(lazy.named_parameters(), direct.named_parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_reset_parameters_defer_init_does_nothing():
    m = te.LayerNormMLP(32, 64, device="cpu")
    before = {n: p.clone() for n, p in m.named_parameters()}
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    m.reset_parameters(defer_init=True)
    assert all(torch.equal(p, before[n] + 1.0) for n, p in m.named_parameters())
    m.reset_parameters()  # restores the norm's and biases' initial values, draws new weights
    assert torch.equal(m.layer_norm_weight, before["layer_norm_weight"])
    assert torch.equal(m.fc1_bias, before["fc1_bias"])
    assert not torch.equal(m.fc1_weight, before["fc1_weight"] + 1.0)


def test_meta_keeps_delayed_wgrad_flags():
    m = te.Linear(32, 16, delay_wgrad_compute=True, device="meta")
    m.to_empty(device="cpu")
    m.reset_parameters()
    assert m.need_backward_dw() and m.weight.skip_backward_post_hook
    m(torch.randn(8, 32)).sum().backward()
    assert m.weight.grad is None
    m.backward_dw()
    assert m.weight.grad.shape == (16, 32)


def test_fp8_model_init_on_meta_is_not_implemented():
    for make in (lambda: te.Linear(32, 16, device="meta"), lambda: te.LayerNormMLP(32, 64, device="meta")):
        with te.fp8_model_init(enabled=True):
            with pytest.raises(NotImplementedError, match="device='meta'.*fp8_model_init"):
                make()


@pytest.mark.parametrize("device", DEVICES)
def test_reset_parameters_of_fp8_parameters_equals_construction(device):
    # fp8_model_init (on a real device): reset_parameters quantizes the new initial values
    # into the FP8 parameters as construction did, split parts each with their own scale.
    with te.fp8_model_init(enabled=True, preserve_high_precision_init_val=True):
        torch.manual_seed(23)
        m = te.Linear(64, 48, parameters_split=("q", "k", "v"), params_dtype=torch.bfloat16, device=device)
        torch.manual_seed(24)
        direct = te.Linear(64, 48, parameters_split=("q", "k", "v"), params_dtype=torch.bfloat16, device=device)
    torch.manual_seed(24)
    m.reset_parameters()
    for (n, p), (_, q) in zip(m.named_parameters(), direct.named_parameters()):
        assert type(p) is type(q), n
        if isinstance(p, te.Float8Tensor):
            assert torch.equal(p._data, q._data) and torch.equal(p._scale_inv, q._scale_inv), n
            assert torch.equal(p.get_high_precision_init_val(), q.get_high_precision_init_val()), n
        else:
            assert torch.equal(p, q), n
