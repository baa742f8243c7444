"""A synthetic token stream with structure a model can learn: a fixed, sparse random Markov chain.

Every token has ``branching`` successors (drawn with replacement, so a few coincide) with fixed,
uneven probabilities, all drawn once from the seed. A model that learns the chain goes from
``ln(vocab)`` at the start towards the chain's entropy (``entropy()``, about 0.8 nats with the
default 4 successors), so a loss that falls is a model that trains. Samples are windows of
``seq + 2`` tokens (inputs, next-token labels, MTP labels; see ``v4.stages``), drawn
deterministically from ``(seed, iteration, replica)``: every pipeline rank that asks for the same
batch gets the same tokens, and data-parallel replicas get different ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

EXTRA_TOKENS = 2  # a sample window is seq + 2 tokens: inputs, next-token labels, MTP labels


class MarkovTokens:
    """``batch(iteration, replica, samples, seq) -> [samples, seq + 2]`` int64 token windows."""

    def __init__(self, vocab: int, seed: int = 0, branching: int = 4):
        if vocab < 2 or not 1 <= branching <= vocab:
            raise ValueError(f"need vocab >= 2 and 1 <= branching <= vocab, got vocab={vocab}, branching={branching}")
        gen = torch.Generator().manual_seed(seed)
        self.vocab, self.seed = vocab, seed
        self.successors = torch.randint(vocab, (vocab, branching), generator=gen)
        self.cumulative = torch.softmax(2.0 * torch.randn(vocab, branching, generator=gen), -1).cumsum(-1)
        self.cumulative[:, -1] = 1.0

    def entropy(self) -> float:
        """Mean entropy of a step of the chain in nats (rows weighted equally): the scale of the loss floor."""
        probs = torch.diff(self.cumulative, dim=-1, prepend=torch.zeros(self.vocab, 1))
        return float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean())

    def batch(self, iteration: int, replica: int, samples: int, seq: int) -> Tensor:
        """``samples`` windows of ``seq + 2`` tokens, the same for the same (iteration, replica)."""
        gen = torch.Generator().manual_seed(((self.seed * 1_000_003 + iteration) * 1_000_033 + replica) % 2**63)
        length = seq + EXTRA_TOKENS
        uniforms = torch.rand(samples, length - 1, generator=gen)
        tokens = torch.empty(samples, length, dtype=torch.int64)
        tokens[:, 0] = torch.randint(self.vocab, (samples,), generator=gen)
        for s in range(1, length):
            current = tokens[:, s - 1]
            choice = (uniforms[:, s - 1, None] > self.cumulative[current]).sum(-1)
            tokens[:, s] = self.successors[current, choice]
        return tokens
