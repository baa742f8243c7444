"""A faithful DeepSeek-V4 training proxy: the model, its presets, and short measured training runs.

The modules follow the data flow of a run:

* ``config``: ``ModelConfig``, the YAML presets (``load_preset``) and each layer's kind;
* ``ops`` (with ``attention_ops``): the eager / Triton switch behind every op the model calls;
* ``mhc``, ``attention``, ``moe``, ``model``: the pieces of the model, each buildable alone
  (``build_layer``, ``build_embedding``, ``build_head``);
* ``recompute``: which layers or modules are recomputed; ``memory``: activation bytes as autograd
  saves them;
* ``stages``: the module of one pipeline stage from a parsed layout; ``data``: the token stream;
* ``optim``: Megatron-style mixed-precision AdamW (18 bytes per parameter); ``flops``: model FLOPs;
* ``pipeline``: ``train(RunConfig) -> RunResult`` over ``torch.distributed.pipelining``, and a
  local gloo launcher for tests.
"""

from __future__ import annotations

import importlib

# name -> module: loaded on first use, so that ``import v4.config`` (the planner's need) does not
# pull in torch.distributed.pipelining
_EXPORTS = {
    "ModelConfig": "config", "PresetError": "config", "layer_kind": "config", "load_preset": "config",
    "preset_names": "config", "Flops": "flops", "model_flops": "flops", "SavedActivations": "memory",
    "build_embedding": "model", "build_head": "model", "build_layer": "model", "BYTES_PER_PARAM": "optim",
    "MixedPrecisionAdamW": "optim", "RunConfig": "pipeline", "RunResult": "pipeline", "StageMemory": "pipeline",
    "launch_local": "pipeline", "merge_results": "pipeline", "train": "pipeline", "RecomputeError": "recompute",
    "RecomputePlan": "recompute", "build_stage": "stages", "stage_io": "stages",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'v4' has no attribute {name!r}")
    return getattr(importlib.import_module(f"v4.{_EXPORTS[name]}"), name)
