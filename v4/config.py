"""The DeepSeek-V4 model shape (``ModelConfig``), its YAML presets, and each layer's kind.

A preset is a YAML file in ``v4/presets/`` holding exactly the fields of :class:`ModelConfig`:
``v4-flash`` and ``v4-pro`` are the published widths (see ``v4-architecture.md``); ``proxy-8l`` and
``proxy-16l`` keep V4-Flash's layer-type mix at a width that trains whole on one or two H200s;
``tiny`` is for CPU tests. ``load_preset`` also takes a path to a YAML file of the same form.

Layer ids follow Megatron's layout strings: decoder layers ``0 .. layers-1``, the MTP layer
``layers`` (only one MTP layer is supported, as V4 has). A layer's attention type comes from
its compression ratio: 0 is sliding-window only, 4 is CSA (overlapping compressor + lightning
indexer + top-k), anything larger is HCA (dense over the compressed entries; V4 uses 128, the
tiny preset a smaller ratio so that HCA matters at a 64-token sequence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

PRESET_DIR = Path(__file__).resolve().parent / "presets"
STREAMS = 4  # mHC residual streams (hc_mult); the project's mHC kernels are written for 4
CSA_RATIO = 4

AttentionType = Literal["window", "csa", "hca"]


class PresetError(ValueError):
    """A preset that is missing or does not describe a valid model; the message says which and why."""


class ModelConfig(BaseModel):
    """Every shape and constant of a V4 model; field names follow the reference table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    vocab: PositiveInt
    hidden: PositiveInt
    layers: PositiveInt
    heads: PositiveInt
    head_dim: PositiveInt = Field(512, description="the single latent used as K and V")
    rope_dim: PositiveInt = Field(64, description="trailing dims of each head that carry RoPE")
    q_lora_rank: PositiveInt
    o_groups: PositiveInt
    o_lora_rank: PositiveInt
    window: PositiveInt = 128
    indexer_heads: PositiveInt = 64
    indexer_dim: PositiveInt = 128
    indexer_topk: PositiveInt = 512
    compress_ratios: tuple[int, ...] = Field(description="one per decoder layer, then one per MTP layer")
    experts: PositiveInt
    experts_per_token: PositiveInt = 6
    shared_experts: int = Field(1, ge=0)
    expert_ffn: PositiveInt
    hash_layers: int = Field(3, ge=0)
    routed_scale: PositiveFloat = 1.5
    mtp_layers: int = Field(1, ge=0, le=1)
    mtp_loss_scale: float = Field(0.1, ge=0)
    norm_eps: PositiveFloat = 1e-6
    hc_eps: PositiveFloat = 1e-6
    sinkhorn_iters: PositiveInt = 20
    rope_theta: PositiveFloat = 10000.0
    compress_rope_theta: PositiveFloat = 160000.0
    init_std: PositiveFloat = 0.02

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        problems = []
        if len(self.compress_ratios) != self.layers + self.mtp_layers:
            problems.append(f"compress_ratios has {len(self.compress_ratios)} entries, need layers + mtp_layers = "
                            f"{self.layers + self.mtp_layers}")
        bad = sorted({r for r in self.compress_ratios if r not in (0, CSA_RATIO) and r <= CSA_RATIO})
        if bad:
            problems.append(f"compress_ratios may hold 0 (window), 4 (CSA) or a ratio > 4 (HCA), got {bad}")
        if self.rope_dim % 2 or self.rope_dim > min(self.head_dim, self.indexer_dim):
            problems.append(f"rope_dim must be even and fit head_dim and indexer_dim, got {self.rope_dim}")
        if (self.heads * self.head_dim) % self.o_groups:
            problems.append(f"heads * head_dim = {self.heads * self.head_dim} is not divisible by "
                            f"o_groups={self.o_groups}")
        if self.experts_per_token > self.experts:
            problems.append(f"experts_per_token={self.experts_per_token} exceeds experts={self.experts}")
        if self.hash_layers > self.layers:
            problems.append(f"hash_layers={self.hash_layers} exceeds layers={self.layers}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def mtp_id(self) -> int | None:
        """The layer id of the MTP layer (Megatron's numbering), or None without MTP."""
        return self.layers if self.mtp_layers else None

    @property
    def layer_ids(self) -> range:
        """Every layer id: the decoder layers, then the MTP layer."""
        return range(self.layers + self.mtp_layers)

    def check_layer(self, layer_id: int) -> None:
        """Raise a clear error for a layer id the model does not have."""
        if layer_id not in self.layer_ids:
            raise ValueError(f"layer id {layer_id} is not in {self.name} (decoder 0..{self.layers - 1}"
                             + (f", MTP {self.layers})" if self.mtp_layers else ")"))

    def attention_type(self, layer_id: int) -> AttentionType:
        """window / csa / hca, from the layer's compression ratio."""
        self.check_layer(layer_id)
        ratio = self.compress_ratios[layer_id]
        return "window" if ratio == 0 else "csa" if ratio == CSA_RATIO else "hca"

    def hash_routed(self, layer_id: int) -> bool:
        """The first ``hash_layers`` decoder layers route by token id; the rest (and MTP) learn."""
        self.check_layer(layer_id)
        return layer_id < self.hash_layers


class ModelArgumentError(ValueError):
    """A parallelism or shape argument (ep, seq, mbs) that does not fit the model; the message names it."""


def expert_parallel_config(config: ModelConfig, ep: int) -> ModelConfig:
    """``config`` with the ``experts / ep`` experts one EP rank holds (see ``tuner.train.profile_layers``)."""
    if ep < 1 or config.experts % ep:
        raise ModelArgumentError(f"ep: {ep} does not divide the {config.experts} experts of {config.name}")
    local = config.experts // ep
    if local < config.experts_per_token:
        raise ModelArgumentError(f"ep: {ep} leaves {local} local experts, fewer than experts_per_token="
                           f"{config.experts_per_token}")
    return config.model_validate({**config.model_dump(), "experts": local})


def layer_kind(config: ModelConfig, layer_id: int) -> str:
    """The profiling kind of a layer: ``"<window|csa|hca>/<hash|learned>"``, or ``"mtp"`` for the MTP layer.

    Layers of one kind cost the same, so a profiler times one layer per kind; the MTP layer is
    its own kind because it adds the next-token embedding and its own head collapse.
    """
    if layer_id == config.mtp_id:
        return "mtp"
    routing = "hash" if config.hash_routed(layer_id) else "learned"
    return f"{config.attention_type(layer_id)}/{routing}"


def preset_names() -> list[str]:
    """The presets shipped in ``v4/presets``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name_or_path: str | Path) -> ModelConfig:
    """A shipped preset by name (``"v4-flash"``), or a YAML file of ModelConfig fields by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise PresetError(f"unknown preset {str(name_or_path)!r}; shipped presets: {preset_names()}")
    elif not path.is_file():
        raise PresetError(f"preset file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
        return ModelConfig.model_validate(data)
    except yaml.YAMLError as exc:
        raise PresetError(f"{path}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors()]
        raise PresetError(f"{path}:\n" + "\n".join(lines)) from None
