"""The module of one pipeline (virtual) stage, built from a parsed layout's ``Stage``.

A stage holds what its symbols say: ``E`` the embedding, ``t`` decoder layers (global ids), ``m``
the MTP layer (id = ``config.layers``), ``L`` the head and the losses. Its forward is
``forward(*activations, tokens=...)``, as ``torch.distributed.pipelining.PipelineStage`` calls it:

* ``tokens [B, S+2]`` (keyword, given to every stage): the microbatch's sample window
  (``v4.data``): the model reads ``tokens[:, :S]``, predicts ``tokens[:, 1:S+1]``, and the MTP
  layer, fed the embedding of ``tokens[:, 1:S+1]``, predicts ``tokens[:, 2:]``. Hash routing, the
  MTP and the loss need the ids on later stages; every rank draws the same batch, and the
  schedule hands each stage its microbatch's slice. Token ids never travel between stages:
  the pipelining API treats whatever it sends as activations (float, with gradients);
* activations in: none for the first stage, else ``(h [B,S,4,D],)``, the four mHC streams, plus
  ``mtp_x [B,S,D]`` once the MTP layer ran on an earlier stage than the loss;
* out: ``(h,)`` or ``(h, mtp_x)``, and from the last stage ``(lm_loss [1], mtp_loss [1])``, the
  microbatch's mean cross entropies (the MTP loss unscaled; zero without MTP). Computing the loss
  in the stage keeps the logits out of the schedule's per-microbatch outputs.

Embedding sharing: V4's MTP layer uses the main embedding's weights (and the main LM head, which
here always sits with the MTP's loss on the ``L`` stage, so the head is truly one module). When
``E`` and ``m`` are on different stages, each holds its own copy of the embedding; both start
equal (seeded per piece) and ``v4.pipeline`` sums their gradients across the copies before each
optimizer step, as Megatron does with its embedding group, so they stay equal.

Whole-layer recompute checkpoints a layer's call here; selective recompute lives in the layers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from v4.layout import PipelineLayout, Stage
from v4.config import STREAMS, ModelConfig
from v4.data import EXTRA_TOKENS
from v4.model import build_embedding, build_head, build_layer, to_streams
from v4.ops import get_ops
from v4.recompute import RecomputePlan


def _call(layer: nn.Module, recompute: bool, *args: Tensor) -> Tensor:
    return checkpoint(layer, *args, use_reentrant=False) if recompute else layer(*args)


class StageModule(nn.Module):
    """``forward(*activations, tokens) -> tuple``: () or (h[, mtp_x]) in; (h[, mtp_x]) or the two losses out."""

    def __init__(self, config: ModelConfig, stage: Stage, recompute: RecomputePlan, kernels: str,
                 device: torch.device, dtype: torch.dtype, seed: int):
        super().__init__()
        symbols = set(stage.symbols)
        self.first, self.last = "E" in symbols, "L" in symbols
        decoder = [i for i in stage.layer_ids if i < config.layers]
        has_mtp = "m" in symbols
        self.expects_mtp = config.mtp_layers > 0
        self.embedding = build_embedding(config, device, dtype, seed) if self.first or has_mtp else None
        self.layers = nn.ModuleList(build_layer(config, i, kernels, recompute, device, dtype, seed) for i in decoder)
        self.recompute_layers = [recompute.is_full(i) for i in decoder]
        self.mtp = build_layer(config, config.layers, kernels, recompute, device, dtype, seed) if has_mtp else None
        self.recompute_mtp = has_mtp and recompute.is_full(config.layers)
        self.head = build_head(config, kernels, device, dtype, seed) if self.last else None

    def forward(self, *activations: Tensor, tokens: Tensor) -> tuple[Tensor, ...]:
        ids = tokens[:, :-EXTRA_TOKENS]
        if self.first:
            if activations:
                raise ValueError(f"the first stage takes only tokens, got {len(activations)} activations")
            h, mtp_x = to_streams(self.embedding(ids)), None
        else:
            if len(activations) not in (1, 2):
                raise ValueError(f"a later stage takes (h,) or (h, mtp_x), got {len(activations)} activations")
            h, mtp_x = activations if len(activations) == 2 else (activations[0], None)
        for layer, recompute in zip(self.layers, self.recompute_layers):
            h = _call(layer, recompute, h, ids)
        if self.mtp is not None:
            next_embedding = self.embedding(tokens[:, 1:-1])
            mtp_x = _call(self.mtp, self.recompute_mtp, h, next_embedding, ids)
        if self.last:
            if self.expects_mtp and mtp_x is None:
                raise ValueError("the model has an MTP layer but its output did not reach the loss stage")
            return self.head(h, tokens[:, 1:-1], mtp_x, tokens[:, EXTRA_TOKENS:])
        return (h,) if mtp_x is None else (h, mtp_x)


def build_stage(config: ModelConfig, stage: Stage, recompute: RecomputePlan, kernels: str = "eager",
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> StageModule:
    """The initialised module of one (virtual) pipeline stage; see the module doc for its tensors.

    Raises ``ValueError`` for a stage that does not fit the model (a ``t`` id out of range, an
    ``m`` not holding the MTP id), a recompute plan naming ids the model lacks, or Triton
    kernels asked for with a dtype they do not take.
    """
    get_ops(kernels)
    layered = [symbol for symbol in stage.symbols if symbol in "tm"]
    if len(layered) != len(stage.layer_ids):
        raise ValueError(f"stage symbols {stage.symbols} do not match its layer ids {stage.layer_ids}")
    for symbol, layer_id in zip(layered, stage.layer_ids):
        if symbol == "t" and not 0 <= layer_id < config.layers:
            raise ValueError(f"'t' holds layer id {layer_id}, {config.name} has decoder layers 0..{config.layers - 1}")
        if symbol == "m" and layer_id != config.mtp_id:
            raise ValueError(f"'m' holds layer id {layer_id}, " + (
                f"the MTP layer of {config.name} is id {config.mtp_id}" if config.mtp_layers
                else f"{config.name} has no MTP layer"))
    recompute.check(len(config.layer_ids))
    if kernels == "triton" and dtype != torch.bfloat16:
        raise ValueError(f"the Triton expert kernels take bfloat16 weights; got dtype {dtype}")
    return StageModule(config, stage, recompute, kernels, torch.device(device), dtype, seed)


def stage_io(config: ModelConfig, layout: PipelineLayout, index: int, mbs: int, seq: int,
             dtype: torch.dtype) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Meta tensors of the activations stage ``index`` takes and returns for one microbatch.

    Given to ``PipelineStage`` so that it need not infer shapes by running the stage on
    placeholder inputs.
    """
    def meta(*shape: int, dtype: torch.dtype = dtype) -> Tensor:
        return torch.empty(shape, dtype=dtype, device="meta", requires_grad=True)

    h, mtp_x = meta(mbs, seq, STREAMS, config.hidden), meta(mbs, seq, config.hidden)
    mtp_before = any("m" in stage.symbols for stage in layout.stages[:index])
    inputs = () if index == 0 else (h, mtp_x) if mtp_before else (h,)
    if index == len(layout.stages) - 1:
        return inputs, (meta(1, dtype=torch.float32), meta(1, dtype=torch.float32))
    mtp_after = mtp_before or "m" in layout.stages[index].symbols
    return inputs, (h, mtp_x) if mtp_after else (h,)
