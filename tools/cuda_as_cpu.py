"""A pytest plugin for a machine without a GPU: runs the CUDA-parametrized tests with every
CUDA tensor made on the CPU instead, so that a new GPU test's own logic (its shapes,
references, bounds and assertions) is exercised before a GPU ever runs it.

    cd tests/python && PYTHONPATH=$PWD/../..:$PWD/../../tools \\
        pytest -q -p cuda_as_cpu -p no:cacheprovider test_softmax.py -k "cuda"

What it checks is the test, never the kernels: the "CUDA" results come from the CPU
reference kernels. It claims a GPU (torch.cuda.is_available, _core.built_with_cuda) and maps
device="cuda" in torch's factory functions, Tensor.cuda and Tensor.to to the CPU. Tests
of CUDA-only behaviour (streams, error messages naming CUDA, events, graphs) fail under
it, and so do rules written for the GPU's summation orders that the CPU's index-order
sums do not meet (e.g. test_bwd_hard_rows at hidden 20000): read a failure before
believing it.
"""

import functools
import types

import torch

torch.cuda.is_available = lambda: True
torch.cuda.synchronize = lambda *args, **kwargs: None
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
# an H100's count, for tests that size their inputs by the SM count
torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(
    multi_processor_count=132, major=9, minor=0, name="H100 (the CPU standing in)", total_memory=80 << 30)

_FACTORIES = ("full", "empty", "zeros", "ones", "tensor", "empty_like", "empty_strided", "zeros_like", "ones_like",
              "full_like", "randn", "rand", "randint", "randn_like", "arange", "eye", "linspace", "as_tensor")


def _on_cpu(factory):
    @functools.wraps(factory)
    def make(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return make


for _name in _FACTORIES:
    setattr(torch, _name, _on_cpu(getattr(torch, _name)))

torch.Tensor.cuda = lambda self, *args, **kwargs: self
_to = torch.Tensor.to


def _to_cpu_for_cuda(self, *args, **kwargs):
    args = tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)
    if str(kwargs.get("device", "")).startswith("cuda"):
        kwargs["device"] = "cpu"
    return _to(self, *args, **kwargs)


torch.Tensor.to = _to_cpu_for_cuda

# torch.mm(..., out_dtype=) exists on CUDA only (the GEMM tests' same-precision baseline):
# here the product in fp32, rounded to out_dtype, a stand-in close enough for a test's logic
_mm = torch.mm


def _mm_any_device(a, b, *args, out_dtype=None, **kwargs):
    if out_dtype is None:
        return _mm(a, b, *args, **kwargs)
    return _mm(a.float(), b.float()).to(out_dtype)


torch.mm = _mm_any_device

from transformer_engine import _core  # noqa: E402  (after torch is patched)

_core.built_with_cuda = lambda: True
