"""The main job's data set, generated rather than downloaded: lines of integer sums
such as ``482+91=573;``, as characters. Predicting the digits of a sum needs what the
prompt said several characters earlier, so the loss keeps falling while a model learns
to add, and a fixed seed makes every run see the same text."""

from __future__ import annotations

import torch

ALPHABET = "0123456789+=;"
# Padded to 32 symbols: FP8 GEMMs need dimensions divisible by 16.
VOCAB_SIZE = 32


def make_text(num_chars: int, seed: int = 0, max_digits: int = 3) -> str:
    gen = torch.Generator().manual_seed(seed)
    parts, length = [], 0
    while length < num_chars:
        a, b = torch.randint(0, 10**max_digits, (2,), generator=gen).tolist()
        line = f"{a}+{b}={a + b};"
        parts.append(line)
        length += len(line)
    return "".join(parts)[:num_chars]


def encode(text: str) -> torch.Tensor:
    lookup = {c: i for i, c in enumerate(ALPHABET)}
    return torch.tensor([lookup[c] for c in text], dtype=torch.long)


class Batches:
    """Random windows of ``seq_len + 1`` tokens: inputs and next-token targets."""

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, seed: int = 0):
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (self.batch_size,), generator=self.gen)
        windows = torch.stack([self.tokens[s:s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1].to(device), windows[:, 1:].to(device)
