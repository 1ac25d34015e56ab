"""Several FP8 casts in one core call (_core.multi_quantize, multi_quantize_current_scaling,
module_ops.QuantizeGroup: a layer's input and weight cast together): every output bit
for bit what the single calls give, on the CPU and on CUDA, where the small casts share
one launch (a block each, whatever their dtypes) and the others run as single ops; float
outputs among them are plain conversions, equal to torch's. Also the one-block kernel
the single calls take for small tensors, at the edge of its size limit."""

import pytest
import torch

from fp8_reference import FP8_DTYPES, assert_same_bits, dtype_id, f32
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of

E4M3, E5M2 = FP8_DTYPES
POISON = 0xAB

# Small ones (one block each on CUDA: at most 16384 elements, multiples of 8), the
# limit itself and just past it, odd sizes, and ones past the limit in both directions.
SMALL = [(16, 64), (64, 64), (8, 8), (128, 128), (24, 40)]
OTHERS = [(136, 128), (3, 17), (61, 127), (1160, 264)]


class Cast:
    """One cast's buffers, poisoned: FP8 outputs, scale, scale_inv and amax."""

    def __init__(self, x, fp8_dtype, scale=2.5, amax=0.5, rowwise=True, columnwise=True):
        rows, cols = x.shape
        dev = x.device
        self.x, self.fp8_dtype = x, fp8_dtype
        self.data = torch.full((rows, cols), POISON, dtype=torch.uint8, device=dev) if rowwise else None
        self.data_t = torch.full((cols, rows), POISON, dtype=torch.uint8, device=dev) if columnwise else None
        self.scale = torch.tensor([scale], device=dev)
        self.scale_inv = torch.full((1,), 1e30, device=dev)
        self.amax = torch.tensor([amax], device=dev)

    def descriptors(self, amax=None):
        rows, cols = self.x.shape
        amax = self.amax if amax is None else amax
        out = _core.Tensor(*describe(self.x, "x").device, int(self.fp8_dtype), [rows, cols],
                           self.data.data_ptr() if self.data is not None else 0,
                           self.data_t.data_ptr() if self.data_t is not None else 0, self.scale.data_ptr(),
                           self.scale_inv.data_ptr(), amax.data_ptr(), int(_core.ScalingMode.PER_TENSOR))
        return describe(self.x, "x"), out

    def results(self):
        return [t for t in (self.data, self.data_t, self.scale, self.scale_inv, self.amax) if t is not None]


def make_casts(shapes, device, gen, dtypes=(torch.bfloat16,), **kwargs):
    casts = []
    for i, shape in enumerate(shapes):
        x = (torch.randn(shape, generator=gen) * 4).to(dtypes[i % len(dtypes)]).to(device)
        casts.append(Cast(x, FP8_DTYPES[i % 2], scale=1.5 + i, **kwargs))
    return casts


def run_multi(casts, current=None):
    """current: None (given scales) or (epsilon, force_pow_2_scales)."""
    inputs, outputs = zip(*(c.descriptors() for c in casts)) if casts else ((), ())
    stream = stream_of(casts[0].x) if casts else 0
    if current is None:
        _core.multi_quantize(list(inputs), list(outputs), stream)
    else:
        _core.multi_quantize_current_scaling(list(inputs), list(outputs), current[0], current[1], stream)


def run_singles(casts, current=None):
    for c in casts:
        x_desc, out = c.descriptors()
        if current is None:
            _core.quantize(x_desc, out, stream_of(c.x))
        else:
            _core.quantize_current_scaling(x_desc, out, current[0], current[1], stream_of(c.x))


def assert_same_casts(got, want):
    for g, w in zip(got, want):
        for a, b in zip(g.results(), w.results()):
            assert_same_bits(a, b)


def fresh_copies(casts):
    return [Cast(c.x, c.fp8_dtype, scale=c.scale.item(), amax=c.amax.item(), rowwise=c.data is not None,
                 columnwise=c.data_t is not None) for c in casts]


@pytest.mark.parametrize("current", [None, (0.0, False), (1e-2, True)], ids=["given", "current", "current_eps_pow2"])
@pytest.mark.parametrize("shapes", [SMALL, SMALL[:2] + OTHERS, OTHERS[:2]], ids=["small", "mixed", "others"])
def test_multi_equals_single_calls(device, shapes, current, gen):
    casts = make_casts(shapes, device, gen, dtypes=(torch.bfloat16, torch.float32))
    expected = fresh_copies(casts)
    run_multi(casts, current)
    run_singles(expected, current)
    assert_same_casts(casts, expected)


@pytest.mark.parametrize("current", [None, (0.0, False)], ids=["given", "current"])
def test_more_casts_than_one_launch_takes(device, current, gen):
    """Eleven small casts: more than the eight one launch carries."""
    casts = make_casts([(16, 32)] * 11, device, gen, dtypes=(torch.float16,))
    expected = fresh_copies(casts)
    run_multi(casts, current)
    run_singles(expected, current)
    assert_same_casts(casts, expected)


@pytest.mark.parametrize("layout", [(True, False), (False, True)], ids=["rowwise", "columnwise"])
def test_one_layout(device, layout, gen):
    casts = make_casts([(32, 48), (40, 16), (3, 17)], device, gen, rowwise=layout[0], columnwise=layout[1])
    expected = fresh_copies(casts)
    run_multi(casts)
    run_singles(expected)
    assert_same_casts(casts, expected)


def test_delayed_casts_may_share_an_amax(device, gen):
    """Two casts raising one amax slot: it ends at the larger of the two maxima."""
    a, b = make_casts([(16, 16), (32, 16)], device, gen)
    shared = torch.zeros(1, device=device)
    inputs, outputs = zip(a.descriptors(shared), b.descriptors(shared))
    _core.multi_quantize(list(inputs), list(outputs), stream_of(a.x))
    assert shared.item() == max(a.x.float().abs().max().item(), b.x.float().abs().max().item())


def test_nan_and_inf_in_small_casts(device):
    """NaN is skipped by the amax; an infinite amax gives current scaling the scale 1."""
    x = torch.tensor([[float("nan"), 2.0, -3.0, 1.0] * 4] * 8, device=device)
    y = x.clone()
    y[0, 1] = float("inf")
    casts = [Cast(x, E4M3), Cast(y, E4M3)]
    run_multi(casts, (0.0, False))
    assert casts[0].amax.item() == 3.0 and casts[0].scale.item() == f32(448.0) / f32(3.0)
    assert casts[1].amax.item() == float("inf") and casts[1].scale.item() == 1.0
    expected = fresh_copies(casts)
    run_singles(expected, (0.0, False))
    assert_same_casts(casts, expected)


def test_no_casts(device):
    _core.multi_quantize([], [], 0)
    _core.multi_quantize_current_scaling([], [], 0.0, False, 0)


def test_bad_pair_is_named_and_nothing_runs(device, gen):
    good, bad = make_casts([(16, 16), (16, 16)], device, gen)
    x_desc, out = good.descriptors()
    bad_x, _ = bad.descriptors()
    bad_out = _core.Tensor(*bad_x.device, int(bad.fp8_dtype), [16, 16], bad.data.data_ptr(),  # no scale
                           scale_inv=bad.scale_inv.data_ptr(), scaling_mode=int(_core.ScalingMode.PER_TENSOR))
    with pytest.raises(ValueError, match=r"te_multi_quantize: outputs\[1\].*scale"):
        _core.multi_quantize([x_desc, bad_x], [out, bad_out], stream_of(good.x))
    # the good pair did not run
    assert (good.data == POISON).all() and good.scale_inv.item() == torch.tensor(1e30).item()
    with pytest.raises(ValueError, match="inputs and outputs differ in length"):
        _core.multi_quantize([x_desc], [out, out], 0)
    with pytest.raises(ValueError, match="te_multi_quantize_current_scaling: epsilon"):
        _core.multi_quantize_current_scaling([x_desc], [out], -1.0, False, stream_of(good.x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pairs_on_two_devices_are_refused(gen):
    cpu_cast, cuda_cast = make_casts([(16, 16)], "cpu", gen) + make_casts([(16, 16)], "cuda", gen)
    inputs, outputs = zip(cpu_cast.descriptors(), cuda_cast.descriptors())
    with pytest.raises(ValueError, match=r"inputs\[1\]"):
        _core.multi_quantize(list(inputs), list(outputs), 0)


@pytest.mark.parametrize("current", [False, True], ids=["delayed", "current"])
def test_quantize_group_equals_module_ops_casts(device, current, gen):
    """module_ops.QuantizeGroup (a layer's input and weight, one core call) == the single casts."""
    x = torch.randn(16, 64, generator=gen).to(torch.bfloat16).to(device)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16).to(device)
    dev = module_ops.core_device(x)
    state = torch.tensor([3.0, 5.0, 0.0, 0.0], device=device)  # scales of x and w, then their amaxes
    ref_state = state.clone()
    group = module_ops.QuantizeGroup(dev)
    if current:
        got = [group.add_current_scaling(x, E4M3, 0.0, False, True, True),
               group.add_current_scaling(w, E4M3, 1e-3, True, True, False)]
        group.run()
        want = [module_ops.quantize_current_scaling(x, E4M3, 0.0, False, True, True, dev),
                module_ops.quantize_current_scaling(w, E4M3, 1e-3, True, True, False, dev)]
    else:
        base, ref_base = state.data_ptr(), ref_state.data_ptr()
        got = [group.add(x, E4M3, base, base + 8, True, True), group.add(w, E5M2, base + 4, base + 12, True, False)]
        group.run()
        want = [module_ops.quantize(x, E4M3, ref_base, ref_base + 8, True, True, dev),
                module_ops.quantize(w, E5M2, ref_base + 4, ref_base + 12, True, False, dev)]
    for g, wt in zip(got, want):
        for a, b in ((g._data, wt._data), (g._transpose, wt._transpose), (g._scale_inv, wt._scale_inv)):
            assert (a is None) == (b is None)
            if a is not None:
                assert_same_bits(a, b)
    assert_same_bits(state, ref_state)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(128, 128), (136, 128), (16, 1024), (8, 2056)], ids=str)
def test_size_limit_of_the_one_block_cast(device, shape, fp8_dtype, gen):
    """The single calls on both sides of the one-block kernel's limit (16384 elements),
    against the CPU core bit for bit."""
    x = (torch.randn(shape, generator=gen) * 8).to(torch.float32)
    for current in (None, (0.0, False)):
        got = [Cast(x.to(device), fp8_dtype)]
        want = [Cast(x, fp8_dtype)]
        run_singles(got, current)
        run_singles(want, current)
        for a, b in zip(got[0].results(), want[0].results()):
            assert_same_bits(a.cpu(), b)


# (shape, input dtype, output dtype): small ones (one block on CUDA), the limit and past
# it, a count that is no multiple of 8, and every direction between the float dtypes.
CONVERSIONS = [((64,), torch.float32, torch.bfloat16), ((16, 1024), torch.float32, torch.bfloat16),
               ((8, 2056), torch.float32, torch.float16), ((3, 17), torch.bfloat16, torch.float32),
               ((40,), torch.float16, torch.bfloat16), ((24, 8), torch.bfloat16, torch.float16),
               ((7,), torch.float32, torch.float32)]


def conversion_input(shape, dtype, gen):
    """Random values over a wide range, with zeros of both signs, infinities and values
    past fp16's range (inf there) and bf16's rounding boundary."""
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-20, 20, shape, generator=gen).float())
    flat = x.view(-1)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 70000.0, 1.0 + 2.0 ** -8])
    flat[:min(flat.numel(), specials.numel())] = specials[:flat.numel()]
    return x.to(dtype)


@pytest.mark.parametrize("current", [None, (0.0, False)], ids=["given", "current"])
def test_float_outputs_are_conversions(device, current, gen):
    """Conversions between casts of other dtypes, in one call: each equals torch's
    conversion bit for bit (round to nearest even, overflow to inf), and the casts equal
    the single calls."""
    casts = make_casts(SMALL[:3], device, gen, dtypes=(torch.float32, torch.bfloat16))
    expected = fresh_copies(casts)
    sources = [conversion_input(shape, src, gen).to(device) for shape, src, _ in CONVERSIONS]
    outs = [torch.full(x.shape, float("nan"), dtype=dst, device=device) for x, (_, _, dst) in zip(sources, CONVERSIONS)]
    inputs, outputs = [], []
    for i, (x, out) in enumerate(zip(sources, outs)):
        inputs.append(describe(x, "x"))
        outputs.append(describe(out, "out"))
        if i < len(casts):
            x_desc, out_desc = casts[i].descriptors()
            inputs.append(x_desc)
            outputs.append(out_desc)
    stream = stream_of(sources[0])
    if current is None:
        _core.multi_quantize(inputs, outputs, stream)
    else:
        _core.multi_quantize_current_scaling(inputs, outputs, current[0], current[1], stream)
    for x, out in zip(sources, outs):
        assert_same_bits(out, x.to(out.dtype))
    run_singles(expected, current)
    assert_same_casts(casts, expected)


FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("where", ["small", "flat", "flat_unaligned"])
@pytest.mark.parametrize("dst", FLOATS, ids=str)
@pytest.mark.parametrize("src", FLOATS, ids=str)
def test_every_conversion(device, src, dst, where, gen):
    """Every direction between the float dtypes, alone in a call: each is its own code on
    the GPU in the one-block kernel (8 x 8), in the flat kernel in vectors (3 x 17) and
    element by element (3 x 17 one element into its storage). Equal to torch's bit for bit."""
    shape = (8, 8) if where == "small" else (3, 17)
    n = shape[0] * shape[1]
    base = conversion_input((n + 1,), src, gen).to(device)
    x = (base[1:] if where == "flat_unaligned" else base[:n]).view(shape)
    out = torch.full(shape, float("nan"), dtype=dst, device=device)
    _core.multi_quantize([describe(x, "x")], [describe(out, "out")], stream_of(x))
    assert_same_bits(out, x.cpu().to(dst))


def test_conversion_rejects_fp8_fields(device, gen):
    x = torch.randn(8, 8, generator=gen).to(device)
    out = torch.empty(8, 8, dtype=torch.bfloat16, device=device)
    scale = torch.ones(1, device=device)
    out_desc = _core.Tensor(*describe(out, "out").device, int(_core.DType.kBFloat16), [8, 8], out.data_ptr(),
                            scale=scale.data_ptr())
    with pytest.raises(ValueError, match=r"outputs\[0\] is a conversion .*scale"):
        _core.multi_quantize([describe(x, "x")], [out_desc], stream_of(x))


@pytest.mark.parametrize("current", [False, True], ids=["delayed", "current"])
def test_quantize_group_conversion(device, current, gen):
    """QuantizeGroup.add_conversion: the fp32 bias of a step next to the casts of an fp32
    weight and a bf16 input, one core call; the conversion equals torch's."""
    x = torch.randn(16, 64, generator=gen).to(torch.bfloat16).to(device)
    w = torch.randn(48, 64, generator=gen).to(device)
    b = torch.randn(48, generator=gen).to(device)
    dev = module_ops.core_device(x)
    group = module_ops.QuantizeGroup(dev)
    state = torch.tensor([3.0, 5.0, 0.0, 0.0], device=device)
    base = state.data_ptr()
    if current:
        casts = [group.add_current_scaling(x, E4M3, 0.0, False, True, True),
                 group.add_current_scaling(w, E4M3, 0.0, False, True, True)]
    else:
        casts = [group.add(x, E4M3, base, base + 8, True, True), group.add(w, E4M3, base + 4, base + 12, True, True)]
    b16 = group.add_conversion(b, torch.bfloat16)
    group.run()
    assert b16.dtype == torch.bfloat16 and b16.shape == b.shape
    assert_same_bits(b16, b.to(torch.bfloat16))
    for cast, src in zip(casts, (x, w)):
        deq = cast.dequantize(dtype=torch.float32)
        assert torch.allclose(deq, src.float(), rtol=2.0 ** -3, atol=2.0 ** -6)
    only = module_ops.QuantizeGroup(dev)  # a group of conversions alone
    b32 = only.add_conversion(b16, torch.float32)
    only.run()
    assert_same_bits(b32, b16.float())
