"""te.Linear against torch.nn.Linear (fp32, bf16), in FP8 against BF16, and its delayed-
scaling metadata, state_dict, gradient accumulation and options."""

import gc
import io

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format
from transformer_engine.pytorch.cpp_extensions.linear_step import SavedFp8
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
# Transformer Engine's test_numerics tolerances.
TOLS = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5)}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def twin(te_linear, dtype):
    """A torch.nn.Linear with te_linear's parameters."""
    ref = torch.nn.Linear(te_linear.in_features, te_linear.out_features, bias=te_linear.use_bias,
                          dtype=dtype, device=te_linear.weight.device)
    with torch.no_grad():
        ref.weight.copy_(te_linear.weight)
        if te_linear.use_bias:
            ref.bias.copy_(te_linear.bias)
    return ref


def run(module, x, grad):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(grad)
    return y, x.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch_linear(device, dtype, bias):
    torch.manual_seed(1)
    m = te.Linear(96, 48, bias=bias, params_dtype=dtype, device=device)
    with torch.no_grad():
        if bias:
            m.bias.normal_()
    ref = twin(m, dtype)
    x = torch.randn(3, 5, 96, dtype=dtype, device=device)
    g = torch.randn(3, 5, 48, dtype=dtype, device=device)
    y, dx = run(m, x, g)
    y_ref, dx_ref = run(ref, x, g)
    torch.testing.assert_close(y, y_ref, **TOLS[dtype])
    torch.testing.assert_close(dx, dx_ref, **TOLS[dtype])
    torch.testing.assert_close(m.weight.grad, ref.weight.grad, **TOLS[dtype])
    if bias:
        torch.testing.assert_close(m.bias.grad, ref.bias.grad, **TOLS[dtype])


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=4), Float8CurrentScaling(),
                                    DelayedScaling(fp8_format=Format.E4M3)], ids=["delayed", "current", "e4m3"])
def test_fp8_close_to_bf16(device, recipe):
    # E4M3 keeps 3 mantissa bits (relative rounding error up to 2^-4), E5M2 2 bits (2^-3);
    # over a dot product of 128 terms the errors average out to a few percent of the
    # result's norm. 6% (forward, E4M3 operands) and 10% (gradients, one E5M2 operand)
    # leave room for that and fail for any wrong scale (errors of 100% and more).
    torch.manual_seed(2)
    m = te.Linear(128, 64, params_dtype=torch.bfloat16, device=device)
    ref = twin(m, torch.bfloat16)
    for _ in range(3):  # later steps use scales from earlier amaxes
        x = torch.randn(32, 128, dtype=torch.bfloat16, device=device)
        g = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
        m.zero_grad()
        ref.zero_grad()
        with te.fp8_autocast(fp8_recipe=recipe):
            y, dx = run(m, x, g)
        y_ref, dx_ref = run(ref, x, g)
        assert rel_err(y, y_ref) < 0.06
        assert rel_err(dx, dx_ref) < 0.10
        assert rel_err(m.weight.grad, ref.weight.grad) < 0.10
        torch.testing.assert_close(m.bias.grad, ref.bias.grad, rtol=1.6e-2, atol=1e-2)
    assert y.dtype == torch.bfloat16 and dx.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
def test_delayed_scaling_scales_follow_amaxes(device):
    # Scales after each step: fp8_max / (max of the amax window); worked out from the
    # tensors themselves, independent of the module's bookkeeping.
    torch.manual_seed(3)
    recipe = DelayedScaling(amax_history_len=2, amax_compute_algo="max")
    m = te.Linear(64, 32, params_dtype=torch.float32, device=device)
    xs = [torch.randn(16, 64, device=device) * s for s in (1.0, 4.0, 0.5)]
    gs = [torch.randn(16, 32, device=device) * s for s in (2.0, 0.25, 1.0)]
    w_amax = m.weight.detach().abs().max().item()
    for i, (x, g) in enumerate(zip(xs, gs)):
        with te.fp8_autocast(fp8_recipe=recipe):
            y = m(x.requires_grad_())
        y.backward(g)
        window = slice(max(0, i - 1), i + 1)
        x_amax = max(t.abs().max().item() for t in xs[window])
        g_amax = max(t.abs().max().item() for t in gs[window])
        FP8GlobalStateManager.flush_deferred_backward_update()  # it would wait for the next autocast exit
        fwd, bwd = m._fwd_state.scale.cpu(), m._bwd_state.scale.cpu()
        # The output and input-gradient slots (fp8_output / fp8_grad) saw no tensor: amax 0
        # keeps their scale at 1.
        torch.testing.assert_close(fwd, torch.tensor([448.0 / x_amax, 448.0 / w_amax, 1.0]), rtol=1e-6, atol=0)
        torch.testing.assert_close(bwd, torch.tensor([57344.0 / g_amax, 1.0]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip_mid_training_restores_exactly(device):
    torch.manual_seed(4)
    recipe = DelayedScaling(amax_history_len=8)
    a = te.Linear(64, 32, device=device)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)

    def step(module, optimizer, x):
        optimizer.zero_grad()
        with te.fp8_autocast(fp8_recipe=recipe):
            loss = module(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    data = [torch.randn(16, 64, device=device) for _ in range(4)]
    for x in data[:2]:
        step(a, opt, x)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    b = te.Linear(64, 32, device=device)
    b.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    for x in data[2:]:
        assert torch.equal(step(a, opt, x), step(b, opt_b, x))
    assert torch.equal(a._fwd_state.amax_history, b._fwd_state.amax_history)
    assert torch.equal(a.weight, b.weight)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
def test_fuse_wgrad_accumulation_adds_into_main_grad(device, fp8):
    torch.manual_seed(5)
    m = te.Linear(64, 32, fuse_wgrad_accumulation=True, device=device)
    plain = te.Linear(64, 32, device=device)
    plain.load_state_dict(m.state_dict())
    m.weight.main_grad = torch.zeros_like(m.weight)
    xs = [torch.randn(16, 64, device=device) for _ in range(2)]
    for x in xs:
        with te.fp8_autocast(enabled=fp8):
            m(x).sum().backward()
        with te.fp8_autocast(enabled=fp8):
            plain(x).sum().backward()
    assert m.weight.grad is None and m.weight.grad_added_to_main_grad
    torch.testing.assert_close(m.weight.main_grad, plain.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"])
def test_fp8_bias_only_training(device, recipe):
    # Frozen weight and an input without grad: the backward computes only the bias
    # gradient, the output gradient's column sums, with no GEMM and no FP8 cast to feed one.
    m = te.Linear(32, 16, device=device)
    m.weight.requires_grad_(False)
    x = torch.randn(16, 32, device=device)
    g = torch.randn(16, 16, device=device)
    with te.fp8_autocast(fp8_recipe=recipe):
        y = m(x)
    y.backward(g)
    assert m.weight.grad is None
    torch.testing.assert_close(m.bias.grad, g.sum(0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_output", [False, True], ids=["float_out", "fp8_out"])
@pytest.mark.parametrize("recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"])
def test_fp8_fp32_bias_is_added_in_bf16_on_the_gpu(device, recipe, fp8_output):
    """fp32 activations in FP8: on the GPU the GEMM adds the bias in bf16 (cuBLASLt's FP8
    GEMM takes no fp32 bias; Transformer Engine does the same), converted in the launch of
    the casts: the output equals that of the module whose bias holds the bf16 values, bit
    for bit. The CPU adds the fp32 bias as it is: the outputs differ there. The bias
    gradient stays fp32 and exact on both."""
    torch.manual_seed(8)
    m = te.Linear(32, 48, device=device)
    with torch.no_grad():
        m.bias.copy_(torch.randn(48) * 3 + 1.0 / 3)  # values bf16 does not hold
    rounded = te.Linear(32, 48, device=device)
    rounded.load_state_dict(m.state_dict())
    with torch.no_grad():
        rounded.bias.copy_(m.bias.bfloat16().float())
    assert not torch.equal(rounded.bias, m.bias)
    x = torch.randn(16, 32, device=device)
    g = torch.randn(16, 48, device=device)
    outs = []
    for module in (m, rounded):
        with te.fp8_autocast(fp8_recipe=recipe):
            y = module(x, fp8_output=fp8_output)
        if fp8_output:
            y = y.dequantize()
        outs.append(y)
    assert outs[0].dtype == torch.float32
    assert torch.equal(outs[0], outs[1]) == (device == "cuda")
    with te.fp8_autocast(fp8_recipe=recipe):
        y = m(x)
    y.backward(g)
    assert m.bias.grad.dtype == torch.float32
    torch.testing.assert_close(m.bias.grad, g.sum(0), rtol=1e-6, atol=1e-5)


def test_fuse_wgrad_accumulation_without_main_grad_is_a_clear_error():
    m = te.Linear(16, 16, fuse_wgrad_accumulation=True, device="cpu")
    with pytest.raises(RuntimeError, match="main_grad"):
        m(torch.randn(8, 16)).sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_split_names_and_values(device):
    torch.manual_seed(6)
    m = te.Linear(32, 48, parameters_split=("query_", "key_", "value_"), device=device)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["query_weight", "query_bias", "key_weight", "key_bias", "value_weight", "value_bias"]
    full = te.Linear(32, 48, device=device)
    with torch.no_grad():
        full.weight.copy_(torch.cat([m.query_weight, m.key_weight, m.value_weight]))
        full.bias.copy_(torch.cat([m.query_bias, m.key_bias, m.value_bias]))
    x = torch.randn(8, 32, device=device)
    torch.testing.assert_close(m(x), full(x))
    sized = te.Linear(32, 48, parameters_split={"a": 16, "b": 32}, device=device)
    assert sized.a_weight.shape == (16, 32) and sized.b_weight.shape == (32, 32)
    with pytest.raises(ValueError, match="add up to out_features"):
        te.Linear(32, 48, parameters_split={"a": 16, "b": 16}, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_split_parts_share_one_buffer_and_train_as_one_weight(device):
    """The parts are consecutive rows of one buffer, which the forward reads as a view
    (no concatenated copy per step); their gradients are the matching rows of a whole
    weight's, also once .to() has given each part a buffer of its own (then joined by a
    concatenation)."""
    torch.manual_seed(8)
    m = te.Linear(32, 48, parameters_split=("query_", "key_", "value_"), device=device)
    parts = [m.query_weight, m.key_weight, m.value_weight]
    row_bytes = 32 * parts[0].element_size()
    assert [p.data_ptr() - parts[0].data_ptr() for p in parts] == [0, 16 * row_bytes, 32 * row_bytes]
    assert m.full_weight().data_ptr() == parts[0].data_ptr(), "the joined weight is a view, not a copy"
    full = te.Linear(32, 48, device=device)
    with torch.no_grad():
        full.weight.copy_(torch.cat(parts))
        full.bias.copy_(torch.cat([m.query_bias, m.key_bias, m.value_bias]))
    x = torch.randn(8, 32, device=device)
    g = torch.randn(8, 48, device=device)
    for module in (m, m.to(torch.float64).to(torch.float32)):  # the second: parts in buffers of their own
        module.zero_grad()
        full.zero_grad()
        module(x).backward(g)
        full(x).backward(g)
        got = torch.cat([module.query_weight.grad, module.key_weight.grad, module.value_weight.grad])
        torch.testing.assert_close(got, full.weight.grad)
        torch.testing.assert_close(torch.cat([module.query_bias.grad, module.key_bias.grad, module.value_bias.grad]),
                                   full.bias.grad)
    assert m.full_weight().data_ptr() != m.query_weight.data_ptr(), "after .to(): a concatenated copy"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("adjacent", [True, False], ids=["one_grad_buffer", "grad_buffer_per_part"])
def test_fuse_wgrad_accumulation_with_split_weight(device, fp8, adjacent):
    """Each part's main_grad takes its rows of the weight gradient, whether the main_grads
    are rows of one buffer (accumulated in place) or separate tensors."""
    torch.manual_seed(9)
    m = te.Linear(64, 48, parameters_split=("query_", "key_", "value_"), fuse_wgrad_accumulation=True,
                  device=device)
    plain = te.Linear(64, 48, parameters_split=("query_", "key_", "value_"), device=device)
    plain.load_state_dict(m.state_dict())
    parts = [m.query_weight, m.key_weight, m.value_weight]
    if adjacent:
        grads = torch.ones(48, 64, device=device)
        for i, p in enumerate(parts):
            p.main_grad = grads[16 * i:16 * (i + 1)]
    else:
        for p in parts:
            p.main_grad = torch.ones(p.shape, device=device)
    for _ in range(2):
        x = torch.randn(16, 64, device=device)
        with te.fp8_autocast(enabled=fp8):
            m(x).sum().backward()
        with te.fp8_autocast(enabled=fp8):
            plain(x).sum().backward()
    for name, p in zip(("query_weight", "key_weight", "value_weight"), parts):
        assert p.grad is None and p.grad_added_to_main_grad
        torch.testing.assert_close(p.main_grad, getattr(plain, name).grad + 1, rtol=1e-5, atol=1e-5)


def test_fuse_wgrad_accumulation_names_the_split_part_without_main_grad():
    m = te.Linear(16, 32, parameters_split=("a", "b"), fuse_wgrad_accumulation=True, device="cpu")
    m.a_weight.main_grad = torch.zeros(16, 16)
    with pytest.raises(RuntimeError, match="weight part 1 \\(parameters_split\\).main_grad"):
        m(torch.randn(8, 16)).sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_return_bias(device):
    m = te.Linear(16, 16, return_bias=True, device=device)
    with torch.no_grad():
        m.bias.fill_(0.5)
    x = torch.randn(8, 16, device=device)
    y, b = m(x)
    torch.testing.assert_close(y + b, torch.nn.functional.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_first_microbatch_caches_the_fp8_weight(device):
    torch.manual_seed(7)
    # Current scaling: the input's cast depends on the input alone, so only the weight
    # can make the outputs differ.
    recipe = Float8CurrentScaling()
    m = te.Linear(32, 32, device=device)
    x = torch.randn(16, 32, device=device)
    with te.fp8_autocast(fp8_recipe=recipe):
        y1 = m(x, is_first_microbatch=True)
    with torch.no_grad():
        m.weight.mul_(2.0)  # not seen until the next first microbatch
    with te.fp8_autocast(fp8_recipe=recipe):
        y2 = m(x, is_first_microbatch=False)
        y3 = m(x, is_first_microbatch=True)
    assert torch.equal(y1, y2)
    assert not torch.allclose(y1, y3)


@requires_cuda
def test_under_torch_autocast_cuda_computes_in_its_dtype():
    m = te.Linear(32, 16, device="cuda")
    x = torch.randn(8, 32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16


def test_under_cpu_autocast_computes_in_its_dtype():
    m = te.Linear(32, 16, device="cpu")
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.weight.grad.dtype == torch.float32


def test_default_device_and_init():
    m = te.Linear(64, 64)
    assert m.weight.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert abs(m.weight.std().item() - 0.023) < 0.005
    assert torch.all(m.bias == 0)


def test_clear_errors():
    m = te.Linear(32, 16, device="cpu")
    with pytest.raises(ValueError, match="in_features=32"):
        m(torch.randn(4, 31))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        m(torch.ones(4, 32, dtype=torch.int32))
    with te.fp8_autocast():
        with pytest.raises(ValueError, match="both dimensions divisible by 16"):
            m(torch.randn(4, 32))
    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        te.Linear(32, 16, tp_size=2, device="cpu")
    with pytest.raises(NotImplementedError, match="ub_overlap_ag"):
        te.Linear(32, 16, ub_overlap_ag=True, device="cpu")
    with pytest.raises(ValueError, match="^Linear: in_features must be a positive int"):
        te.Linear(0, 16, device="cpu")
    # LayerNormLinear shares Linear's constructor; its errors name it.
    with pytest.raises(ValueError, match="^LayerNormLinear: out_features must be a positive int"):
        te.LayerNormLinear(16, 0, device="cpu")
    with pytest.raises(TypeError, match="^LayerNormLinear: params_dtype"):
        te.LayerNormLinear(16, 16, params_dtype=torch.int32, device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [8, 24], ids=lambda r: f"rows{r}")
def test_fp8_rows_not_divisible_by_16_are_refused(device, rows):
    """8 or 24 rows: Transformer Engine's documented rule refuses them in the module, with
    the input's shape, on every device (the GPU's FP8 GEMM cannot take them)."""
    m = te.Linear(64, 64, device=device, params_dtype=torch.bfloat16)
    x = torch.randn(rows // 4, 4, 64, device=device, dtype=torch.bfloat16)
    with te.fp8_autocast():
        with pytest.raises(ValueError, match=rf"divisible by 16 .*got \[{rows}, 64\]"):
            m(x)
    with te.fp8_autocast():
        assert m(torch.randn(32, 64, device=device, dtype=torch.bfloat16)).shape == (32, 64)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_model_init_keeps_weights_only_in_fp8(device):
    torch.manual_seed(8)
    with te.fp8_model_init(enabled=True, preserve_high_precision_init_val=True):
        m = te.Linear(64, 32, params_dtype=torch.bfloat16, device=device)
    assert isinstance(m.weight, te.Float8Tensor) and isinstance(m.weight, torch.nn.Parameter)
    assert m.weight._data.dtype == torch.uint8 and m.weight.dtype == torch.bfloat16
    init = m.weight.get_high_precision_init_val()
    assert init.device.type == "cpu" and init.dtype == torch.bfloat16
    # The FP8 value is the cast of the initial value (E4M3: within 2^-4 relative, or the
    # subnormal step of the chosen scale).
    torch.testing.assert_close(m.weight.dequantize(dtype=torch.float32).cpu(), init.float(), rtol=2**-4, atol=1e-3)
    m.weight.clear_high_precision_init_val()
    assert m.weight.get_high_precision_init_val() is None
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    x = torch.randn(16, 64, dtype=torch.bfloat16, device=device)
    target = torch.randn(16, 32, dtype=torch.bfloat16, device=device)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        with te.fp8_autocast():
            loss = (m(x).float() - target.float()).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert isinstance(m.weight, te.Float8Tensor)  # the optimizer step re-quantized in place
    assert losses[-1] < losses[0]


@requires_cuda
def test_fp8_model_init_memory_cuda():
    # A bf16 [4096, 4096] weight is 32 MiB; its FP8 data 16 MiB (the transposed copy is
    # made by the first forward that needs it).
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    plain = te.Linear(4096, 4096, bias=False, params_dtype=torch.bfloat16, device="cuda")
    plain_bytes = torch.cuda.memory_allocated() - before
    del plain
    before = torch.cuda.memory_allocated()
    with te.fp8_model_init():
        fp8 = te.Linear(4096, 4096, bias=False, params_dtype=torch.bfloat16, device="cuda")
    gc.collect()  # the bf16 value the cast read is garbage now (compute-sanitizer runs delay its release)
    fp8_bytes = torch.cuda.memory_allocated() - before
    assert plain_bytes >= 32 * 2**20
    assert fp8_bytes <= 16 * 2**20 + 2**16, (plain_bytes, fp8_bytes)
    del fp8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"])
def test_fp8_saves_only_the_columnwise_input(recipe, device):
    """The wgrad GEMM reads the input's column-wise FP8 copy only: that is all the forward
    saves (the row-wise one, the forward GEMM's, is freed), and the backward still runs."""
    layer = te.Linear(64, 32, device=device)
    x = torch.randn(48, 64, device=device, requires_grad=True)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        y = layer(x)
    saved_x = y.grad_fn.state[0]  # the autograd ctx's attributes are its grad_fn's
    if isinstance(saved_x, SavedFp8):  # the one-call forward's: one buffer, no row-wise x in it
        assert saved_x.buffer.numel() == 2 * 256 + 48 * 64 + 2 * 32 * 64  # scale_invs, x^T, W, W^T
        saved_x = saved_x.storage()[0]
    assert saved_x._data is None and saved_x._transpose is not None
    assert tuple(saved_x._transpose.shape) == (64, 48)
    y.float().pow(2).sum().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@requires_cuda
def test_fp8_forward_memory_cuda():
    """After an FP8 forward, an [8192, 4096] bf16 input costs one FP8 copy (32 MiB, the
    column-wise one the wgrad GEMM reads), not two: the row-wise copy is freed."""
    layer = te.Linear(4096, 64, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with te.fp8_autocast(enabled=True):
        layer(x).sum().backward()  # first step: the weight's FP8 copies and workspaces exist after it
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with te.fp8_autocast(enabled=True):
        y = layer(x)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    assert 32 * 2**20 <= grown < 40 * 2**20, grown / 2**20
    del y


@pytest.mark.parametrize("device", DEVICES)
def test_deepcopy_with_cached_fp8_weight(device):
    """A module holding the FP8 weight cast on the first microbatch deep-copies (its own
    copy of the FP8 buffers), and the copy computes what the original does."""
    import copy

    layer = te.Linear(64, 32, device=device)
    x = torch.randn(16, 64, device=device)
    with te.fp8_autocast(enabled=True):
        layer(x, is_first_microbatch=True)
    twin_layer = copy.deepcopy(layer)
    original, copied = layer._fp8_weight_cache["weight"], twin_layer._fp8_weight_cache["weight"]
    assert copied._data.data_ptr() != original._data.data_ptr()
    assert torch.equal(copied._data, original._data) and torch.equal(copied._scale_inv, original._scale_inv)
    with te.fp8_autocast(enabled=True):
        y_copy = twin_layer(x, is_first_microbatch=False)
    with te.fp8_autocast(enabled=True):
        y = layer(x, is_first_microbatch=False)
    assert torch.equal(y, y_copy)
