r"""Model FLOPs per token of V4 training, from the config and the sequence length.

Forward FLOPs per token (a multiply-add is 2 FLOPs; D hidden, H heads, d = head_dim, q = q_lora_rank,
o = o_lora_rank, G = o_groups, E experts, k active, F expert_ffn, V vocab; averages are over the
query positions s = 0..S-1 of a causal sequence):

* attention projections: 2 (D q + q H d + D d + H d o + G o D)
* attended entries (FlashMLA's convention, K and V both the d-wide latent):
  2 · mean_s(n(s)) · H · (d + d), with n(s) = min(s+1, window) + the compressed entries of s:
  0 (window), floor((s+1)/r) (HCA), min(topk, floor((s+1)/4)) (CSA)
* compressor (CSA and HCA; coff = 2 for CSA, 1 for HCA): 2 D (2 coff d) for its two projections
  + 2 coff d for the pooling
* indexer (CSA, heads h_i of width d_i): 2 q h_i d_i + 2 D h_i + its own compressor (d_i wide)
  + mean_s(floor((s+1)/4)) · h_i · (2 d_i + 2) for the scores
* MoE: 2 D E (router) + 6 k D F (routed experts) + 6 D F · shared_experts
* mHC, per sub-layer (two per layer): 2·4D·24 (glue) + 2·4D (collapse) + 2·20D (expand) = 240 D
* head: 2·4D·4 + 2·4D (stream collapse) + 2 D V (LM head)
* MTP: 2 D D (e_proj) + 2·4 D D (h_proj, on each stream) + its block + its head (as the head)

Norms, RoPE, softmaxes, Sinkhorn and the loss are elementwise and left out; the embedding is a
lookup. Training FLOPs per token = 3 × forward (backward = 2 × forward), except the indexer,
which is frozen and only runs forward (1 ×). Recomputation is not model FLOPs and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from v4.config import CSA_RATIO, STREAMS, ModelConfig

_MHC_PER_SUBLAYER = 2 * STREAMS * 24 + 2 * STREAMS + 2 * (STREAMS + STREAMS * STREAMS)  # × D


@dataclass(frozen=True)
class Flops:
    """Forward FLOPs per token by part; ``training`` applies the 3× rule (1× for the frozen indexer)."""

    attention_projections: float = 0.0
    attention_core: float = 0.0
    compressors: float = 0.0
    indexer: float = 0.0
    moe: float = 0.0
    mhc: float = 0.0
    head: float = 0.0
    mtp_extra: float = 0.0

    def __add__(self, other: Flops) -> Flops:
        return Flops(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def forward(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def training(self) -> float:
        return 3 * (self.forward - self.indexer) + self.indexer


def _sum_closed(n: int, ratio: int) -> int:
    """``sum over s = 1..n of floor(s / ratio)``: ``ratio`` values at each level below ``n // ratio``, the rest at it."""
    levels, rest = divmod(n, ratio)
    return ratio * levels * (levels - 1) // 2 + levels * (rest + 1)


def _mean_closed(seq: int, ratio: int, cap: int | None = None) -> float:
    """mean over s < seq of the closed compressed groups ``floor((s+1)/ratio)``, optionally capped (exact, closed form)."""
    if cap is None or seq < (cap + 1) * ratio:  # no query closes more than cap groups
        return _sum_closed(seq, ratio) / seq
    below = _sum_closed(cap * ratio - 1, ratio)  # queries with fewer than cap closed groups
    return (below + cap * (seq - cap * ratio + 1)) / seq


def _mean_window(seq: int, window: int) -> float:
    """mean over s < seq of the window positions ``min(s + 1, window)``."""
    inside = min(seq, window)
    return (inside * (inside + 1) // 2 + (seq - inside) * window) / seq


def _compressor(config: ModelConfig, ratio: int, dim: int) -> float:
    coff = 2 if ratio == CSA_RATIO else 1
    return 2 * config.hidden * 2 * coff * dim + 2 * coff * dim


def layer_flops(config: ModelConfig, layer_id: int, seq: int) -> Flops:
    """Forward FLOPs per token of one decoder layer (or of the MTP layer's block) at sequence length ``seq``."""
    c = config
    kind, ratio = c.attention_type(layer_id), c.compress_ratios[layer_id]
    width = c.heads * c.head_dim
    projections = 2 * (c.hidden * c.q_lora_rank + c.q_lora_rank * width + c.hidden * c.head_dim
                       + width * c.o_lora_rank + c.o_groups * c.o_lora_rank * c.hidden)
    window = _mean_window(seq, c.window)
    compressed = {"window": 0.0, "hca": _mean_closed(seq, ratio) if ratio else 0.0,
                  "csa": _mean_closed(seq, CSA_RATIO, c.indexer_topk)}[kind]
    core = 2 * (window + compressed) * c.heads * 2 * c.head_dim
    compressors = _compressor(c, ratio, c.head_dim) if ratio else 0.0
    indexer = 0.0
    if kind == "csa":
        hi, di = c.indexer_heads, c.indexer_dim
        indexer = (2 * c.q_lora_rank * hi * di + 2 * c.hidden * hi + _compressor(c, CSA_RATIO, di)
                   + _mean_closed(seq, CSA_RATIO) * hi * (2 * di + 2))
    moe = (2 * c.hidden * c.experts + 6 * c.experts_per_token * c.hidden * c.expert_ffn
           + 6 * c.hidden * c.expert_ffn * c.shared_experts)
    return Flops(attention_projections=projections, attention_core=core, compressors=compressors,
                 indexer=indexer, moe=moe, mhc=2 * _MHC_PER_SUBLAYER * c.hidden)


def head_flops(config: ModelConfig) -> float:
    """Forward FLOPs per token of a head: the stream collapse and the LM head."""
    return 2 * STREAMS * config.hidden * STREAMS + 2 * STREAMS * config.hidden + 2 * config.hidden * config.vocab


def model_flops(config: ModelConfig, seq: int) -> Flops:
    """Forward FLOPs per token of the whole model (decoder layers, MTP, heads) by part; see the module doc."""
    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    total = Flops(head=head_flops(config))
    for layer_id in config.layer_ids:
        total = total + layer_flops(config, layer_id, seq)
    if config.mtp_layers:
        projections = 2 * config.hidden ** 2 * (1 + STREAMS)
        total = total + Flops(mtp_extra=projections + head_flops(config))
    return total
