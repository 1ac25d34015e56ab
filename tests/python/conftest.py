"""Shared fixtures: the device parameter, a per-test seeded generator, and a fresh FP8
global state (modules opt in with ``pytestmark = pytest.mark.usefixtures("fresh_fp8_state")``).

Every test that takes `device` runs on "cpu", and on "cuda" only where torch
sees a GPU *and* the core was built with CUDA kernels; elsewhere the CUDA
variant is skipped, not failed.
"""

import zlib

import pytest
import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import fused_attn as _fused_attn

HAVE_CUDA = torch.cuda.is_available() and _core.built_with_cuda()
CUDA_SKIP_REASON = (
    "needs a CUDA device and a CUDA build of OpenTE "
    f"(torch.cuda.is_available()={torch.cuda.is_available()}, built_with_cuda={_core.built_with_cuda()})"
)
requires_cuda = pytest.mark.skipif(not HAVE_CUDA, reason=CUDA_SKIP_REASON)
# The cuDNN fused-attention backend: a build without the cuDNN frontend, or a GPU the
# backend refuses, runs the unfused attention instead.
CUDNN_REASON = CUDA_SKIP_REASON if not HAVE_CUDA else _fused_attn.cudnn_unavailable_reason()
requires_cudnn = pytest.mark.skipif(CUDNN_REASON is not None, reason=f"needs cuDNN fused attention: {CUDNN_REASON}")

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def pytest_addoption(parser):
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run the K-th of N interleaved shares of the collected tests (every N-th from the K-th): "
        "the GPU suite, longer than one device call, in N calls (tools/device_check.sh's TESTS_SHARD)",
    )


def _shard(value):
    """(k, n) from "K/N", 1 <= K <= N; a usage error naming --shard otherwise."""
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N (two integers), got {value!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {value!r}")
    return k, n


_SHARD = pytest.StashKey()


def pytest_configure(config):
    # checked before collection, so that a bad value stops the run before any test
    value = config.getoption("--shard")
    config.stash[_SHARD] = None if value is None else _shard(value)


def pytest_collection_modifyitems(config, items):
    shard = config.stash[_SHARD]
    if shard is None:
        return
    k, n = shard
    # Interleaved, not contiguous: a file's slow parametrizations (the _large tests) spread
    # over the shares, so each takes about 1/N of the suite's time.
    kept = items[k - 1 :: n]
    kept_ids = {id(item) for item in kept}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
    items[:] = kept


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def seed(request):
    # Stable across runs and machines, different for every test case, so a
    # failure reproduces with the same data.
    return zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.fixture
def fresh_fp8_state():
    """FP8GlobalStateManager reset before and after the test: no autocast depth, recipe,
    registered scaling states or deferred update leaks from one test into the next."""
    from transformer_engine.pytorch.fp8 import FP8GlobalStateManager

    FP8GlobalStateManager.reset()
    yield
    FP8GlobalStateManager.reset()
