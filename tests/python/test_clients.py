"""Real clients of transformer_engine.pytorch, unmodified: Lightning Fabric with
precision="transformer-engine" (its TransformerEnginePrecision swaps nn.Linear and
nn.LayerNorm for te.Linear / te.LayerNorm, casts to bf16 and trains under
te.fp8_autocast) and HF accelerate's Transformer Engine conversion. Each is skipped when
the client is not installed, or when transformer_engine is not installed as a
distribution (Lightning checks the package metadata)."""

import importlib.metadata

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_te_dist = pytest.mark.skipif(not _installed("transformer_engine"),
                                   reason="transformer_engine is not pip-installed (Lightning reads its metadata)")


def make_model():
    # Dimensions FP8 takes (in % 8 == 0 and out % 16 == 0, Lightning's own rule).
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                               torch.nn.Linear(128, 32))


@needs_te_dist
@pytest.mark.parametrize("device", DEVICES)
def test_lightning_fabric_transformer_engine_precision(device):
    L = pytest.importorskip("lightning")
    torch.manual_seed(0)
    fabric = L.Fabric(accelerator=device, devices=1, precision="transformer-engine")
    model = fabric.setup_module(make_model())
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(te.Linear) == 2 and kinds.count(te.LayerNorm) == 1
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-3))
    x = torch.randn(64, 64, device=fabric.device)
    y = torch.randn(64, 32, device=fabric.device)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # Fitting a fixed batch: the loss must fall clearly (a broken FP8 path or frozen
    # weights leave it flat or make it blow up).
    assert losses[-1] < 0.7 * losses[0], losses
    first = next(m for m in model.modules() if isinstance(m, te.Linear))
    assert first._fwd_state is not None and torch.all(first._fwd_state.scale[:2] != 1.0)  # FP8 ran (input, weight)


def test_accelerate_convert_model():
    # accelerate builds te.Linear / te.LayerNorm without a device argument: they land on
    # the default device (the GPU when there is one), where the model is then.
    accelerate = pytest.importorskip("accelerate")
    te_utils = pytest.importorskip("accelerate.utils.transformer_engine")
    accelerator = accelerate.Accelerator()  # the state convert_model consults
    device = accelerator.device
    torch.manual_seed(1)
    model = make_model().to(device)
    x = torch.randn(16, 64, device=device)
    want = model(x)
    with torch.no_grad():
        te_utils.convert_model(model, to_transformer_engine=True, _convert_linear=True, _convert_ln=True)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(te.Linear) == 2 and kinds.count(te.LayerNorm) == 1
    torch.testing.assert_close(model(x), want, rtol=1.3e-6, atol=1e-5)
    with te.fp8_autocast():
        out = model(x)
    assert ((out - want).norm() / want.norm()).item() < 0.1  # FP8 rounding, see test_linear.py
