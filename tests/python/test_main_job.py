"""The main job's training loop (examples/train_gpt.py) for a few steps of its tiny
configuration on the CPU: BF16 and FP8 (delayed scaling, fp32 parameters under
torch.autocast) both train, and FP8 stays near BF16. The full run is
`bash tools/main_job.sh`; this keeps its FP8 path from breaking unnoticed in CI."""

import importlib.util
import math
import os
import sys

import pytest
import torch

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.fixture(scope="module")
def train_gpt():
    sys.path.insert(0, EXAMPLES)
    try:
        spec = importlib.util.spec_from_file_location("train_gpt", os.path.join(EXAMPLES, "train_gpt.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(EXAMPLES)


def test_tiny_run_trains_in_bf16_and_fp8(train_gpt, capsys):
    cfg, batch, _, lr = train_gpt.CONFIGS["tiny"]
    tokens = train_gpt.encode(train_gpt.make_text(20_000))
    steps = 12
    runs = {label: train_gpt.train(label, fp8, cfg, batch, steps, lr, torch.device("cpu"), tokens)
            for label, fp8 in (("BF16", False), ("FP8", True))}
    for label, run in runs.items():
        losses = run["losses"]
        assert all(math.isfinite(v) for v in losses), f"{label}: {losses}"
        assert losses[-1] < losses[0] - 0.5, f"{label} did not train: {losses}"
    bf16, fp8 = runs["BF16"]["losses"], runs["FP8"]["losses"]
    assert abs(fp8[0] - bf16[0]) < 0.05, "the first step's loss, before any update, differs"
    assert abs(fp8[-1] - bf16[-1]) < 0.3, f"FP8 {fp8} against BF16 {bf16}"


def test_results_table(train_gpt):
    """The table names each run's peak memory in MiB, or says that a CPU run has none (it
    printed "nan" there), and gives the FP8 / BF16 throughput ratio."""
    runs = {"BF16": {"losses": [3.0] * 5 + [2.0] * 10, "tokens_per_s": 2000.0, "peak_mib": 1536.4},
            "FP8": {"losses": [3.0] * 5 + [2.5] * 10, "tokens_per_s": 3000.0, "peak_mib": None}}
    table = train_gpt.results_table(runs)
    assert "| BF16 | 2000 | 1536 | 2.0000 |" in table
    assert "| FP8 | 3000 | not tracked on the CPU | 2.5000 |" in table
    assert "FP8 / BF16 throughput: 1.50x" in table
    assert "nan" not in table
