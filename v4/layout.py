"""Megatron/Primus pipeline-layout strings (``--pipeline-model-parallel-layout``) for DeepSeek-V4.

A layout such as ``Et*10|t*12|t*12|t*9mL`` says which model pieces each pipeline stage holds:
``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss, ``|`` ends a stage. ``X*N``
repeats one symbol, ``(...)*N`` repeats a group (which may hold ``|`` and nest); commas and
whitespace are cosmetic. Stage ``i`` runs on pipeline rank ``i % pp`` as its virtual stage
``i // pp`` (the interleaved schedule), so a layout with ``pp * vpp`` stages fixes ``vpp``.

Parsing checks Megatron's rules up front, so a bad layout fails here with the rule, the stage
and the character position, instead of deep inside a training launch. Positions are 0-based
indexes into the original text. Every :class:`LayoutError` carries a ``rule`` name, one of
:data:`RULES`, which its message starts with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SYMBOLS = frozenset("EtmL")
COSMETIC = frozenset(", \t\r\n")

RULES = (
    "arguments", "unknown-character", "unbalanced-parentheses", "repeat-count", "empty-stage",
    "stage-count", "embedding", "loss", "layer-count", "mtp-count", "mtp-order", "mtp-stage", "too-large",
)
# Bounds far beyond any model (a layout names each layer once): a text past them is refused before it
# exhausts the stack or the memory.
MAX_DEPTH = 64  # nested groups
MAX_SYMBOLS = 1_000_000  # symbols after expanding the repeats


class LayoutError(ValueError):
    """A layout that breaks one of :data:`RULES`; ``rule``, ``position`` and ``stage`` say where."""

    def __init__(self, rule: str, message: str, position: int | None = None, stage: int | None = None):
        where = []
        if stage is not None:
            where.append(f"stage {stage}")
        if position is not None:
            where.append(f"position {position}")
        suffix = f" (at {', '.join(where)})" if where else ""
        super().__init__(f"{rule}: {message}{suffix}")
        self.rule = rule
        self.position = position
        self.stage = stage


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its symbols in order and the global ids of the layers (``t`` and ``m``) it holds."""

    symbols: tuple[str, ...]
    layer_ids: tuple[int, ...]


@dataclass(frozen=True)
class PipelineLayout:
    """A validated layout: ``stages`` in global order over ``pp`` ranks."""

    stages: tuple[Stage, ...]
    pp: int

    @property
    def vpp(self) -> int:
        """Virtual stages per rank (1 without interleaving)."""
        return len(self.stages) // self.pp

    @property
    def num_layers(self) -> int:
        """Decoder layers (``t``) in the layout."""
        return sum(stage.symbols.count("t") for stage in self.stages)

    @property
    def mtp_layers(self) -> int:
        """MTP layers (``m``) in the layout."""
        return sum(stage.symbols.count("m") for stage in self.stages)

    def rank_of(self, stage_index: int) -> int:
        """The pipeline rank that runs stage ``stage_index``."""
        return stage_index % self.pp

    def virtual_index(self, stage_index: int) -> int:
        """Which of its rank's virtual stages stage ``stage_index`` is."""
        return stage_index // self.pp

    def layers_per_rank(self) -> tuple[tuple[int, ...], ...]:
        """Per rank, the layer ids it holds (MTP ids included), virtual stage 0 first."""
        return tuple(
            tuple(i for stage in self.stages[rank::self.pp] for i in stage.layer_ids)
            for rank in range(self.pp)
        )


class _Parser:
    """Recursive descent over the text, expanding repeats into ``(token, position)`` pairs.

    Each expanded token keeps the position of the character it came from, so rule checks
    after expansion can still point into the original text.
    """

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.depth = 0

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in COSMETIC:
            self.pos += 1

    def parse(self) -> list[tuple[str, int]]:
        tokens = self._sequence()
        if self.pos < len(self.text):  # only a ')' stops _sequence early
            raise LayoutError("unbalanced-parentheses", "')' without a matching '('", self.pos)
        return tokens

    def _sequence(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        while True:
            self._skip()
            if self.pos >= len(self.text) or self.text[self.pos] == ")":
                return out
            out.extend(self._item())
            if len(out) > MAX_SYMBOLS:
                raise LayoutError("too-large", f"more than {MAX_SYMBOLS:,} symbols once repeated", self.pos)

    def _item(self) -> list[tuple[str, int]]:
        start = self.pos
        char = self.text[start]
        if char in SYMBOLS or char == "|":
            self.pos += 1
            atom = [(char, start)]
        elif char == "(":
            self.pos += 1
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise LayoutError("too-large", f"groups nested more than {MAX_DEPTH} deep", start)
            atom = self._sequence()
            self.depth -= 1
            if self.pos >= len(self.text):
                raise LayoutError("unbalanced-parentheses", "'(' is never closed", start)
            self.pos += 1
        elif char == "*":
            raise LayoutError("repeat-count", "'*' must follow a symbol or a ')'", start)
        elif char.isdigit():
            raise LayoutError("repeat-count", f"count {char!r} without a '*' before it", start)
        else:
            raise LayoutError("unknown-character", f"unexpected character {char!r}", start)
        self._skip()
        if self.pos < len(self.text) and self.text[self.pos] == "*":
            if char == "|":
                raise LayoutError("repeat-count", "'|' cannot be repeated: it would make empty stages", self.pos)
            count = self._count()
            if len(atom) * count > MAX_SYMBOLS:
                raise LayoutError("too-large", f"more than {MAX_SYMBOLS:,} symbols once repeated", start)
            return atom * count
        return atom

    def _count(self) -> int:
        star = self.pos
        self.pos += 1
        self._skip()
        digits_start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        digits = self.text[digits_start:self.pos]
        if len(digits) > len(str(MAX_SYMBOLS)):
            raise LayoutError("too-large", f"count {digits[:12]}{'...' if len(digits) > 12 else ''} is beyond "
                              f"{MAX_SYMBOLS:,}", star)
        if not digits or int(digits) < 1:
            raise LayoutError("repeat-count", "'*' needs a positive integer count", star)
        return int(digits)


def _check_arguments(num_layers: int, pp: int, mtp_layers: int) -> None:
    if pp < 1 or num_layers < 1 or mtp_layers < 0:
        raise LayoutError(
            "arguments", f"need pp >= 1, num_layers >= 1, mtp_layers >= 0; got pp={pp}, "
            f"num_layers={num_layers}, mtp_layers={mtp_layers}")


def parse_layout(text: str, num_layers: int, pp: int, mtp_layers: int = 1) -> PipelineLayout:
    """Parse and validate ``text`` against the model (``num_layers``, ``mtp_layers``) and ``pp``.

    Decoder layers get ids ``0..num_layers-1`` in layout order, MTP layers ``num_layers`` onwards.
    Empty stages are rejected: a stage with no symbol is almost always a typo (``||``, a trailing
    ``|``), and one holding only ``E`` or ``L`` is not empty.
    """
    _check_arguments(num_layers, pp, mtp_layers)
    tokens = _Parser(text).parse()

    staged: list[list[tuple[str, int]]] = [[]]
    for token, position in tokens:
        if token == "|":
            if not staged[-1]:
                raise LayoutError("empty-stage", "stage has no symbols", position, len(staged) - 1)
            staged.append([])
        else:
            staged[-1].append((token, position))
    if not staged[-1]:
        raise LayoutError("empty-stage", "stage has no symbols", len(text), len(staged) - 1)
    if len(staged) % pp:
        raise LayoutError("stage-count", f"{len(staged)} stages is not a multiple of pp={pp}")
    vpp = len(staged) // pp
    last = len(staged) - 1

    flat = [(s, token, position) for s, stage in enumerate(staged) for token, position in stage]
    for symbol, rule, name, want_stage, want_index in (
        ("E", "embedding", "first", 0, 0), ("L", "loss", "last", last, len(staged[last]) - 1),
    ):
        hits = [(s, position) for s, token, position in flat if token == symbol]
        if len(hits) != 1:
            at = hits[1] if hits else (None, None)
            raise LayoutError(rule, f"'{symbol}' must appear exactly once, found {len(hits)}", at[1], at[0])
        s, position = hits[0]
        if s != want_stage or staged[s][want_index][0] != symbol:
            raise LayoutError(rule, f"'{symbol}' must be the {name} symbol of the {name} stage", position, s)

    decoder = sum(token == "t" for _, token, _ in flat)
    if decoder != num_layers:
        raise LayoutError("layer-count", f"{decoder} 't' symbols, the model has {num_layers} decoder layers")
    mtp = sum(token == "m" for _, token, _ in flat)
    if mtp != mtp_layers:
        raise LayoutError("mtp-count", f"{mtp} 'm' symbols, the model has {mtp_layers} MTP layers")

    seen_t = 0
    for s, token, position in flat:
        if token == "t":
            seen_t += 1
        elif token == "m":
            if seen_t < num_layers:
                raise LayoutError("mtp-order", "'m' must come after every 't'", position, s)
            if s // pp != vpp - 1:
                raise LayoutError(
                    "mtp-stage", f"'m' must be in the last virtual stage of its rank "
                    f"(virtual index {vpp - 1}), this stage has virtual index {s // pp}", position, s)

    next_t, next_m = 0, num_layers
    stages = []
    for stage in staged:
        ids = []
        for token, _ in stage:
            if token == "t":
                ids.append(next_t)
                next_t += 1
            elif token == "m":
                ids.append(next_m)
                next_m += 1
        stages.append(Stage(tuple(token for token, _ in stage), tuple(ids)))
    return PipelineLayout(tuple(stages), pp)


def _format_stage(symbols: tuple[str, ...]) -> str:
    parts = []
    i = 0
    while i < len(symbols):
        j = i
        while j < len(symbols) and symbols[j] == symbols[i]:
            j += 1
        parts.append(symbols[i] if j - i == 1 else f"{symbols[i]}*{j - i}")
        i = j
    return "".join(parts)


def format_layout(layout: PipelineLayout) -> str:
    """The canonical string: stages joined by ``|``, runs of a symbol written ``t*N``, no groups."""
    return "|".join(_format_stage(stage.symbols) for stage in layout.stages)


def format_ranges(ids: Iterable[int]) -> str:
    """``0-3,7,43``: sorted ids with runs collapsed (``-`` for none)."""
    ids = sorted(ids)
    parts = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts) or "-"


def describe(layout: PipelineLayout) -> str:
    """A table of stage, rank, virtual index, symbols and layer ids (MTP ids marked ``mtp:``)."""
    rows = [("stage", "rank", "virtual", "symbols", "layers")]
    for s, stage in enumerate(layout.stages):
        decoder = tuple(i for i in stage.layer_ids if i < layout.num_layers)
        mtp = tuple(i for i in stage.layer_ids if i >= layout.num_layers)
        layers = format_ranges(decoder) + (f" mtp:{format_ranges(mtp)}" if mtp else "")
        rows.append((str(s), str(layout.rank_of(s)), str(layout.virtual_index(s)),
                     _format_stage(stage.symbols), layers))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def even_layout(num_layers: int, pp: int, vpp: int = 1, mtp_layers: int = 1) -> PipelineLayout:
    """Megatron's even split over ``pp * vpp`` stages: ``E`` opens the first, ``m``s and ``L`` close the last.

    Each stage gets ``num_layers // (pp * vpp)`` decoder layers; the remainder goes one layer each
    to the last stages, walking backwards. The early stages are spared because under 1F1B stage
    ``i`` of ``p`` holds ``p - i`` microbatches in flight, so stage 0 (which also holds the
    embedding) is the tightest on activation memory. Raises ``empty-stage`` when a middle stage
    would get no layer.
    """
    _check_arguments(num_layers, pp, mtp_layers)
    if vpp < 1:
        raise LayoutError("arguments", f"need vpp >= 1, got vpp={vpp}")
    count = pp * vpp
    base, extra = divmod(num_layers, count)
    stages = [["t"] * (base + (s >= count - extra)) for s in range(count)]
    stages[0].insert(0, "E")
    stages[-1].extend(["m"] * mtp_layers + ["L"])
    return parse_layout("|".join(_format_stage(tuple(stage)) for stage in stages), num_layers, pp, mtp_layers)


def megatron_recompute(layout: PipelineLayout, recompute_layer_ids: Iterable[int]) -> dict[str, Any] | None:
    """Megatron's flags for the same recompute, ``{}`` for none, or None when they cannot say it.

    Megatron recomputes whole decoder layers with ``--recompute-granularity full`` and either
    ``--recompute-method uniform --recompute-num-layers 1`` (every layer) or ``--recompute-method
    block --recompute-num-layers N`` (the first N decoder layers of every virtual stage). Any other
    set, or one holding an MTP layer, needs Primus's ``recompute_layer_ids``.
    """
    ids = set(recompute_layer_ids)
    if not ids:
        return {}
    if any(i >= layout.num_layers for i in ids):
        return None
    full = {"recompute_granularity": "full"}
    if ids == set(range(layout.num_layers)):
        return full | {"recompute_method": "uniform", "recompute_num_layers": 1}
    decoder = [[i for i in stage.layer_ids if i < layout.num_layers] for stage in layout.stages]
    for n in range(1, max(map(len, decoder)) + 1):
        if ids == {i for stage in decoder for i in stage[:n]}:
            return full | {"recompute_method": "block", "recompute_num_layers": n}
    return None
