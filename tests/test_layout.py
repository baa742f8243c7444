"""Pipeline-layout strings: the V4 layouts parse to the right layer ids, every rule is enforced,
and the canonical form round-trips on random valid layouts."""

from __future__ import annotations

import random

import pytest

from v4.layout import (
    RULES, LayoutError, PipelineLayout, Stage, describe, even_layout, format_layout, parse_layout,
)


def _ids(layout: PipelineLayout) -> list[list[int]]:
    return [list(stage.layer_ids) for stage in layout.stages]


def test_v4_flash_layout() -> None:
    layout = parse_layout("Et*10|t*12|t*12|t*9mL", num_layers=43, pp=4)
    assert _ids(layout) == [list(range(0, 10)), list(range(10, 22)), list(range(22, 34)),
                            list(range(34, 43)) + [43]]
    assert layout.stages[0].symbols == ("E",) + ("t",) * 10
    assert layout.stages[3].symbols[-2:] == ("m", "L")
    assert (layout.pp, layout.vpp, layout.num_layers, layout.mtp_layers) == (4, 1, 43, 1)
    assert format_layout(layout) == "Et*10|t*12|t*12|t*9mL"


def test_one_layer_per_stage_group() -> None:
    layout = parse_layout("E(t|)*43mL", num_layers=43, pp=4)
    assert len(layout.stages) == 44 and layout.vpp == 11
    assert _ids(layout)[:3] == [[0], [1], [2]] and _ids(layout)[-1] == [43]
    assert layout.stages[-1].symbols == ("m", "L")
    assert (layout.rank_of(43), layout.virtual_index(43)) == (3, 10)


def test_groups_nest_and_hold_separators() -> None:
    assert _ids(parse_layout("E(t*2|)*3t*2mL", 8, 4)) == [[0, 1], [2, 3], [4, 5], [6, 7, 8]]
    nested = parse_layout("E((t|)*2t|)*2tmL", 7, 7)
    assert _ids(nested) == [[0], [1], [2], [3], [4], [5], [6, 7]]
    assert nested.stages[0].symbols == ("E", "t")


def test_commas_and_whitespace_are_cosmetic() -> None:
    plain = parse_layout("Et*10|t*12|t*12|t*9mL", 43, 4)
    assert parse_layout(" E, t * 10 |\tt*12, | t*12 |t*9 , m L\n", 43, 4) == plain
    assert parse_layout("E,t,t|t,t,m,L", 4, 2) == parse_layout("Ett|ttmL", 4, 2)


def test_interleaved_ranks_and_layers_per_rank() -> None:
    layout = parse_layout("Et*2|t*2|t*2|t*2mL", 8, pp=2)
    assert layout.vpp == 2
    assert [layout.rank_of(s) for s in range(4)] == [0, 1, 0, 1]
    assert [layout.virtual_index(s) for s in range(4)] == [0, 0, 1, 1]
    assert layout.layers_per_rank() == ((0, 1, 4, 5), (2, 3, 6, 7, 8))


def test_mtp_may_close_an_earlier_rank() -> None:
    """m only needs the last virtual stage of its rank and no t after it, not the last stage."""
    layout = parse_layout("Et*4m|L", 4, pp=2)
    assert _ids(layout) == [[0, 1, 2, 3, 4], []]


def test_describe_lists_every_stage() -> None:
    lines = describe(parse_layout("Et*2|t*2|t*2|t*2mL", 8, pp=2)).splitlines()
    assert lines[0].split() == ["stage", "rank", "virtual", "symbols", "layers"]
    assert lines[1].split() == ["0", "0", "0", "Et*2", "0-1"]
    assert lines[4].split() == ["3", "1", "1", "t*2mL", "6-7", "mtp:8"]


# (rule, text, num_layers, pp, mtp_layers, position or None)
VIOLATIONS = [
    ("arguments", "EtL", 1, 0, 0, None),
    ("unknown-character", "Et*2x|t*2mL", 4, 2, 1, 4),
    ("unbalanced-parentheses", "E(t|t mL", 2, 2, 1, 1),
    ("unbalanced-parentheses", "Et|t)mL", 2, 2, 1, 4),
    ("repeat-count", "Et*|tmL", 2, 2, 1, 2),
    ("repeat-count", "Et*0|t*2mL", 2, 2, 1, 2),
    ("repeat-count", "*2Et|tmL", 2, 2, 1, 0),
    ("repeat-count", "Et|*2tmL", 2, 2, 1, 3),
    ("repeat-count", "Et2|tmL", 2, 2, 1, 2),
    ("empty-stage", "Et||tmL", 2, 3, 1, 3),
    ("empty-stage", "Et|tmL|", 2, 3, 1, 7),
    ("stage-count", "Et|t|tmL", 3, 2, 1, None),
    ("embedding", "t|EtmL", 2, 2, 1, 2),
    ("embedding", "tE|tmL", 2, 2, 1, 1),
    ("embedding", "Et|EtmL", 2, 2, 1, 3),
    ("embedding", "t|tmL", 2, 2, 1, None),
    ("loss", "Et|tLm", 2, 2, 1, 4),
    ("loss", "EtL|tm", 2, 2, 1, 2),
    ("loss", "Et|tm", 2, 2, 1, None),
    ("layer-count", "Et*3|t*3mL", 5, 2, 1, None),
    ("mtp-count", "Et|tmmL", 2, 2, 1, None),
    ("mtp-count", "Et|tL", 2, 2, 1, None),
    ("mtp-order", "Et|mtL", 2, 2, 1, 3),
    ("mtp-stage", "Et*2|t*2m|m|L", 4, 2, 2, 8),
    ("too-large", "E" + "(" * 5000 + "t" + ")" * 5000 + "mL", 1, 1, 1, 65),  # no RecursionError
    ("too-large", "Et*1000000000mL", 1, 1, 1, 2),  # no MemoryError
    ("too-large", "E((t*1000)*1000)*1000mL", 1, 1, 1, 1),
]


def test_every_rule_has_a_violation_case() -> None:
    assert {case[0] for case in VIOLATIONS} == set(RULES)


@pytest.mark.parametrize(("rule", "text", "num_layers", "pp", "mtp", "position"), VIOLATIONS)
def test_violation_names_its_rule(rule: str, text: str, num_layers: int, pp: int, mtp: int,
                                  position: int | None) -> None:
    with pytest.raises(LayoutError, match=f"^{rule}: ") as caught:
        parse_layout(text, num_layers, pp, mtp)
    assert caught.value.rule == rule
    assert caught.value.position == position
    if position is not None:
        assert f"position {position}" in str(caught.value)


def test_errors_name_the_stage() -> None:
    with pytest.raises(LayoutError, match=r"stage 1") as caught:
        parse_layout("Et*2|t*2m|m|L", 4, 2, mtp_layers=2)
    assert caught.value.stage == 1


def _random_case(rng: random.Random) -> tuple[str, list[list[str]], int, int, int]:
    """A valid layout written in a random style, with the stage symbols it must parse to."""
    pp, vpp = rng.randint(1, 4), rng.randint(1, 3)
    count, mtp = pp * vpp, rng.randint(0, 2)
    # The first and last stages are never empty (E, L), so they may hold no t; the others need one.
    sizes = [rng.randint(0 if s in (0, count - 1) else 1, 6) for s in range(count)]
    if sum(sizes) == 0:
        sizes[0] = 1
    stages = [["t"] * n for n in sizes]
    stages[0].insert(0, "E")
    stages[-1].extend(["m"] * mtp + ["L"])
    pieces = []
    s = 0
    while s < count:
        run = 1
        while s + run < count and stages[s + run] == stages[s] and rng.random() < 0.7:
            run += 1
        body = _random_stage_text(rng, stages[s])
        if run > 1 or rng.random() < 0.2:
            sep = "|" if s + run < count else ""
            pieces.append(f"({body}|)*{run - 1}{body}{sep}" if run > 1 else f"({body}){sep}")
        else:
            pieces.append(body + ("|" if s + run < count else ""))
        s += run
    return "".join(pieces), stages, sum(sizes), pp, mtp


def _random_stage_text(rng: random.Random, symbols: list[str]) -> str:
    out = []
    i = 0
    while i < len(symbols):
        j = i
        while j < len(symbols) and symbols[j] == symbols[i]:
            j += 1
        n = rng.randint(1, j - i)
        out.append(f"{symbols[i]}*{n}" if n > 1 or rng.random() < 0.2 else symbols[i])
        out.append(rng.choice(["", "", ",", " ", ", "]))
        i += n
    return "".join(out)


def test_random_layouts_parse_and_round_trip() -> None:
    rng = random.Random(20240611)
    for _ in range(300):
        text, stages, num_layers, pp, mtp = _random_case(rng)
        layout = parse_layout(text, num_layers, pp, mtp)
        assert [list(stage.symbols) for stage in layout.stages] == stages, text
        flat = [i for stage in layout.stages for i in stage.layer_ids]
        assert flat == list(range(num_layers + mtp)), text
        assert parse_layout(format_layout(layout), num_layers, pp, mtp) == layout, text
        assert format_layout(parse_layout(format_layout(layout), num_layers, pp, mtp)) == format_layout(layout)


@pytest.mark.parametrize(("num_layers", "pp", "vpp", "mtp"), [(43, 4, 1, 1), (61, 8, 2, 1), (16, 4, 2, 0),
                                                              (7, 1, 1, 2), (30, 4, 3, 1)])
def test_even_layout_splits_evenly(num_layers: int, pp: int, vpp: int, mtp: int) -> None:
    layout = even_layout(num_layers, pp, vpp, mtp)
    counts = [stage.symbols.count("t") for stage in layout.stages]
    assert len(counts) == pp * vpp and layout.vpp == vpp
    assert sum(counts) == num_layers and counts == sorted(counts) and max(counts) - min(counts) <= 1
    assert layout.stages[0].symbols[0] == "E"
    assert layout.stages[-1].symbols[-1 - mtp:] == ("m",) * mtp + ("L",)
    assert layout.mtp_layers == mtp


def test_even_layout_puts_remainder_last() -> None:
    assert format_layout(even_layout(43, 4)) == "Et*10|t*11|t*11|t*11mL"
    assert format_layout(even_layout(8, 2, vpp=2, mtp_layers=0)) == "Et*2|t*2|t*2|t*2L"


def test_even_layout_rejects_too_few_layers() -> None:
    with pytest.raises(LayoutError, match="^empty-stage"):
        even_layout(1, 4)


def test_layout_is_frozen() -> None:
    layout = parse_layout("EtmL", 1, 1)
    assert layout.stages == (Stage(("E", "t", "m", "L"), (0, 1)),)
    with pytest.raises(AttributeError):
        layout.pp = 2  # type: ignore[misc]
