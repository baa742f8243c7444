"""Which activations a run recomputes instead of keeping: whole layers by global id, and selective modules.

A ``RecomputePlan`` names the layers recomputed whole (decoder ids, the MTP layer is id
``layers``, as Primus's ``recompute_layer_ids``) and the modules recomputed inside every other
layer, from :data:`SELECTIVE_MODULES`:

* ``attn_core``: the sparse attention (scores, softmax, weighted sum), keeping q and the latents;
* ``moe_act``: the expert MLPs, keeping their input (see ``v4.moe`` for how this differs from
  Megatron's activation-only ``moe_act``);
* ``mhc``: the mHC entry (glue, Sinkhorn, collapse, norm) and expand around both sub-layers.

Everything is applied with ``torch.utils.checkpoint`` (non-reentrant). A layer recomputed whole
has no selective checkpoints inside it.

Text form (what a run config carries): parts joined by ``;``, each either layer ids and
inclusive ranges (``"0-3,7,43"``) or ``"selective:"`` and module names (``"selective:attn_core,mhc"``);
``""`` or ``"none"`` is no recompute. ``RecomputePlan.text`` writes the canonical form back.

``from_megatron`` turns Megatron's global knobs into a plan for a given pipeline layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from v4.layout import PipelineLayout

SELECTIVE_MODULES = ("attn_core", "moe_act", "mhc")
MEGATRON_MODULES = {"core_attn": "attn_core", "moe_act": "moe_act", "mhc": "mhc"}  # Megatron name -> ours
_SELECTIVE_PREFIX = "selective:"


class RecomputeError(ValueError):
    """A recompute plan that cannot be parsed or does not fit the model; the message says which part and why."""


@dataclass(frozen=True)
class RecomputePlan:
    """Layers recomputed whole (global ids) and modules recomputed selectively in the others."""

    full_layers: frozenset[int] = field(default_factory=frozenset)
    selective: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "full_layers", frozenset(self.full_layers))
        object.__setattr__(self, "selective", frozenset(self.selective))
        unknown = sorted(self.selective - set(SELECTIVE_MODULES))
        if unknown:
            raise RecomputeError(f"unknown selective module(s) {unknown}; known: {', '.join(SELECTIVE_MODULES)}")
        negative = sorted(i for i in self.full_layers if i < 0)
        if negative:
            raise RecomputeError(f"layer ids must be >= 0, got {negative}")

    @classmethod
    def parse(cls, text: str) -> RecomputePlan:
        """Read the text form (see the module doc); raises ``RecomputeError`` naming the bad part."""
        layers: set[int] = set()
        modules: set[str] = set()
        stripped = text.strip()
        if stripped.lower() in ("", "none"):
            return cls()
        for part in (p.strip() for p in stripped.split(";")):
            if not part:
                raise RecomputeError(f"empty part in {text!r} (a doubled or trailing ';')")
            if part.startswith(_SELECTIVE_PREFIX):
                names = [n.strip() for n in part[len(_SELECTIVE_PREFIX):].split(",")]
                if not all(names):
                    raise RecomputeError(f"{part!r}: give module names after 'selective:', "
                                         "e.g. 'selective:attn_core,mhc'")
                unknown = sorted(set(names) - set(SELECTIVE_MODULES))
                if unknown:
                    raise RecomputeError(f"{part!r}: unknown module(s) {unknown}; "
                                         f"known: {', '.join(SELECTIVE_MODULES)}")
                modules.update(names)
            else:
                layers.update(_parse_ids(part))
        return cls(frozenset(layers), frozenset(modules))

    @property
    def text(self) -> str:
        """The canonical text form: ids as sorted ranges, then the sorted selective modules."""
        parts = []
        if self.full_layers:
            parts.append(_format_ids(sorted(self.full_layers)))
        if self.selective:
            parts.append(_SELECTIVE_PREFIX + ",".join(m for m in SELECTIVE_MODULES if m in self.selective))
        return ";".join(parts) or "none"

    def check(self, n_layer_ids: int) -> None:
        """Raise ``RecomputeError`` for a layer id the model (``n_layer_ids`` ids, MTP included) does not have."""
        beyond = sorted(i for i in self.full_layers if i >= n_layer_ids)
        if beyond:
            raise RecomputeError(f"layer id(s) {beyond} out of range: the model has ids 0..{n_layer_ids - 1} "
                                 "(decoder layers, then MTP)")

    def is_full(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` is recomputed whole."""
        return layer_id in self.full_layers

    def inside(self, layer_id: int) -> RecomputePlan:
        """The plan a layer applies inside itself: its selective modules, none if it is recomputed whole."""
        return RecomputePlan() if self.is_full(layer_id) else RecomputePlan(selective=self.selective)

    @classmethod
    def from_megatron(cls, granularity: str | None, method: str | None, num_layers: int | None, pp: int,
                      layout: PipelineLayout, modules: Iterable[str] = ("core_attn",)) -> RecomputePlan:
        """The plan Megatron's ``--recompute-granularity/-method/-num-layers`` (and ``--recompute-modules``) make.

        ``full`` + ``uniform``: every decoder layer (Megatron checkpoints runs of ``num_layers``
        layers as one unit, keeping one input per run; this plan checkpoints each layer, keeping
        one input per layer: the same with ``num_layers=1``, the Primus default). ``full`` +
        ``block``: the first ``num_layers`` decoder layers of every (virtual) pipeline stage.
        ``selective``: ``modules`` in every layer, by Megatron's names or ours. The MTP layer is
        not covered by these knobs (Primus names it by id in ``recompute_layer_ids``).
        """
        if layout.pp != pp:
            raise RecomputeError(f"the layout has pp={layout.pp}, the run pp={pp}")
        if granularity in (None, "none"):
            return cls()
        if granularity == "selective":
            names = {MEGATRON_MODULES.get(m, m) for m in modules}
            return cls(selective=frozenset(names))
        if granularity != "full":
            raise RecomputeError(f"granularity must be 'full', 'selective' or None, got {granularity!r}")
        if num_layers is None or num_layers < 1:
            raise RecomputeError(f"full recompute needs num_layers >= 1, got {num_layers}")
        decoder = [[i for i in stage.layer_ids if i < layout.num_layers] for stage in layout.stages]
        if method == "uniform":
            return cls(frozenset(i for ids in decoder for i in ids))
        if method == "block":
            return cls(frozenset(i for ids in decoder for i in ids[:num_layers]))
        raise RecomputeError(f"full recompute needs method 'uniform' or 'block', got {method!r}")


def _parse_ids(part: str) -> set[int]:
    ids: set[int] = set()
    for item in (i.strip() for i in part.split(",")):
        low, dash, high = item.partition("-")
        if not low.strip().isdigit() or (dash and not high.strip().isdigit()):
            raise RecomputeError(f"{item!r} in {part!r} is not a layer id or an 'a-b' range of ids "
                                 "(selective modules need the 'selective:' prefix)")
        start, stop = int(low), int(high) if dash else int(low)
        if stop < start:
            raise RecomputeError(f"range {item!r} in {part!r} runs backwards")
        ids.update(range(start, stop + 1))
    return ids


def _format_ids(ids: list[int]) -> str:
    runs: list[str] = []
    start = prev = ids[0]
    for i in ids[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(runs)
