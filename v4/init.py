"""Seeded, placement-independent parameter initialisation.

Every model piece (a layer, the embedding, the head) draws its initial values from its own CPU
generator seeded by ``(seed, piece name)``, so a piece starts from the same values whichever
pipeline stage, process or device holds it: a 2-stage run and a 1-stage run of one seed start
from the same model, and two copies of the shared embedding start equal. Modules that own
parameters define ``init_from(gen)``; ``initialize`` calls them in module order.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn


def generator(seed: int, piece: str) -> torch.Generator:
    """A CPU generator for one model piece, independent of every other piece's."""
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(piece.encode()))


def fill_normal(tensor: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """Overwrite ``tensor`` with N(0, std^2) values drawn on the CPU from ``gen``."""
    tensor.data.copy_(torch.empty(tensor.shape, dtype=torch.float32).normal_(0.0, std, generator=gen))


def initialize(module: nn.Module, seed: int, piece: str) -> nn.Module:
    """Initialise every submodule of ``module`` that has ``init_from``, from the piece's generator."""
    if any(p.is_meta for p in module.parameters()):
        return module
    gen = generator(seed, piece)
    with torch.no_grad():
        for sub in module.modules():
            if hasattr(sub, "init_from"):
                sub.init_from(gen)
    return module
