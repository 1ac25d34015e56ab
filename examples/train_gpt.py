"""The main job: a small GPT built from te.TransformerLayer blocks, trained on a
generated data set first in BF16 and then in FP8 (same seed, same data), with a progress
bar per run. Writes the loss curves (PNG) and a table (tokens/s, peak memory, final
loss) to --out.

    python3 examples/train_gpt.py                 # GPU if there is one, else a tiny CPU run
    python3 examples/train_gpt.py --config tiny   # the CPU configuration anywhere
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformer_engine.pytorch as te  # noqa: E402
from gpt.data import VOCAB_SIZE, Batches, encode, make_text  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.png_plot import plot_curves  # noqa: E402
from transformer_engine.common.recipe import DelayedScaling, Format  # noqa: E402

# name: (model, batch size, steps, learning rate)
CONFIGS = {
    # Large enough that the GEMMs, not the host, set the pace (FP8 pays off from about
    # hidden 2048 on an H100/H200).
    "gpu": (GPTConfig(VOCAB_SIZE, hidden=2048, heads=16, layers=8, ffn=8192, seq_len=1024), 16, 300, 3e-4),
    "tiny": (GPTConfig(VOCAB_SIZE, hidden=64, heads=4, layers=2, ffn=256, seq_len=64), 16, 150, 3e-3),
}


def progress(label: str, step: int, total: int, loss: float, tokens_per_s: float) -> None:
    width = 30
    done = int(width * step / total)
    bar = "#" * done + "-" * (width - done)
    end = "\n" if step == total else ""
    print(f"\r{label:5s} [{bar}] {step:4d}/{total} loss {loss:6.3f} {tokens_per_s:10.0f} tok/s", end=end, flush=True)


def train(label: str, fp8: bool, cfg: GPTConfig, batch: int, steps: int, lr: float, device: torch.device,
          tokens: torch.Tensor):
    torch.manual_seed(0)
    model = GPT(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    batches = Batches(tokens, batch, cfg.seq_len, seed=1)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    losses, timed_tokens, timed_seconds = [], 0, 0.0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(1, steps + 1):
        x, y = batches.next(device)
        start = time.perf_counter()
        # BF16 compute everywhere (torch.autocast), the TE layers in FP8 on the FP8 run.
        with torch.autocast(device.type, dtype=torch.bfloat16), te.fp8_autocast(enabled=fp8, fp8_recipe=recipe):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronises: the step's time is complete
        if step > min(5, steps // 10):  # the first steps warm up caches and kernels
            timed_seconds += time.perf_counter() - start
            timed_tokens += x.numel()
        losses.append(value)
        progress(label, step, steps, value, timed_tokens / timed_seconds if timed_seconds else 0.0)
    # PyTorch tracks a peak for CUDA memory only (the CPU allocator keeps no statistics)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"losses": losses, "tokens_per_s": timed_tokens / max(timed_seconds, 1e-9), "peak_mib": peak}


def results_table(runs: dict) -> str:
    """The Markdown table of the runs (tokens/s, peak memory, final loss) and the FP8
    speed-up."""
    rows = ["| run | tokens/s | peak memory (MiB) | final loss (mean of last 10 steps) |", "|---|---|---|---|"]
    for name, r in runs.items():
        final = sum(r["losses"][-10:]) / len(r["losses"][-10:])
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "not tracked on the CPU"
        rows.append(f"| {name} | {r['tokens_per_s']:.0f} | {peak} | {final:.4f} |")
    speedup = runs["FP8"]["tokens_per_s"] / runs["BF16"]["tokens_per_s"]
    return "\n".join(rows) + f"\n\nFP8 / BF16 throughput: {speedup:.2f}x\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=list(CONFIGS), default=None,
                        help="gpu (default with a GPU) or tiny (default without)")
    parser.add_argument("--steps", type=int, default=None, help="override the configuration's step count")
    parser.add_argument("--out", default="results", help="folder for loss_curves.png and results.md")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = args.config or ("gpu" if device.type == "cuda" else "tiny")
    cfg, batch, steps, lr = CONFIGS[config]
    steps = args.steps or steps
    tokens = encode(make_text(2_000_000 if config == "gpu" else 200_000))
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, config {config}: "
          f"{cfg}, batch {batch}, {steps} steps")
    runs = {"BF16": train("BF16", False, cfg, batch, steps, lr, device, tokens),
            "FP8": train("FP8", True, cfg, batch, steps, lr, device, tokens)}

    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "loss_curves.png")
    plot_curves(png, {"BF16": ((30, 90, 200), runs["BF16"]["losses"]),
                      "FP8": ((220, 50, 40), runs["FP8"]["losses"])})
    table = results_table(runs)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(f"device: {device}, config: {config}, {cfg}, batch {batch}, {steps} steps\n\n{table}")
    print("\n" + table + f"\nwrote {png} and {os.path.join(args.out, 'results.md')}")


if __name__ == "__main__":
    main()
