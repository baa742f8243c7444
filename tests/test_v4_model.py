"""The V4 training proxy on one process: presets, the eager attention ops against brute force, stage
shapes and splits, training, recompute, the memory meter, the optimizer, data and FLOPs, and the
Triton kernels against eager on single layers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from kernels.arch import kernel_device
from v4.layout import Stage, parse_layout
from v4.attention import grouped_projection
from v4.attention_ops import compress_pool, indexer_topk, rope_tail, sparse_attention
from v4.config import PresetError, layer_kind, load_preset, preset_names
from v4.data import MarkovTokens
from v4.flops import Flops, layer_flops, model_flops
from v4.memory import SavedActivations
from v4.moe import expert_offsets
from v4.model import build_head, build_layer
from v4.ops import get_ops
from v4.optim import BYTES_PER_PARAM, MixedPrecisionAdamW, clip_coefficient, _accumulate
from v4.recompute import RecomputeError, RecomputePlan
from v4.stages import build_stage, stage_io

TINY = load_preset("tiny")
SEQ = 64


@pytest.fixture(autouse=True)
def _one_thread():
    """Small ops gain nothing from threads, and a shared 2-core box loses a lot to oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tokens(samples: int = 2, seq: int = SEQ, iteration: int = 0) -> torch.Tensor:
    return MarkovTokens(TINY.vocab, seed=0).batch(iteration, 0, samples, seq)


def _model(layout: str = "EttttmL", recompute: RecomputePlan = RecomputePlan(), pp: int = 1, **kwargs):
    parsed = parse_layout(layout, TINY.layers, pp, TINY.mtp_layers)
    return [build_stage(TINY, stage, recompute, **kwargs) for stage in parsed.stages], parsed


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


# ----- config and presets -------------------------------------------------------------------


def test_presets_load_with_the_reference_layer_mix() -> None:
    assert {"v4-flash", "v4-pro", "proxy-8l", "proxy-16l", "tiny"} <= set(preset_names())
    flash, pro = load_preset("v4-flash"), load_preset("v4-pro")
    kinds = [flash.attention_type(i) for i in range(flash.layers)]
    assert (kinds.count("window"), kinds.count("csa"), kinds.count("hca")) == (2, 21, 20)
    assert flash.attention_type(flash.mtp_id) == "window" and flash.mtp_id == 43
    pro_kinds = [pro.attention_type(i) for i in range(pro.layers)]
    assert (pro_kinds.count("csa"), pro_kinds.count("hca"), pro.heads, pro.routed_scale) == (30, 31, 128, 2.5)
    assert [layer_kind(flash, i) for i in (0, 2, 3, 4, 43)] == [
        "window/hash", "csa/hash", "hca/learned", "csa/learned", "mtp"]
    proxy = load_preset("proxy-8l")
    mix = [proxy.attention_type(i) for i in range(proxy.layers)]
    assert (mix.count("window"), mix.count("csa"), mix.count("hca")) == (3, 3, 2)


def test_tiny_has_every_attention_type_and_both_routings() -> None:
    kinds = {layer_kind(TINY, i) for i in TINY.layer_ids}
    assert {"window/hash", "csa/hash", "hca/learned", "csa/learned", "mtp"} == kinds


def test_bad_presets_are_named(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="unknown preset 'nope'"):
        load_preset("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.model_copy().model_dump_json().replace('"compress_ratios":[0,4,16,4,0]',
                                                               '"compress_ratios":[0,4,2]'))
    with pytest.raises(PresetError, match="compress_ratios has 3 entries.*ratio > 4"):
        load_preset(bad)
    with pytest.raises(ValueError, match="layer id 9 is not in tiny"):
        layer_kind(TINY, 9)


# ----- eager attention ops against brute force ----------------------------------------------


def _brute_attention(q, kv, sink, ratio, kvc, indices, window):
    """Per query and head: gather the entries, softmax with the sink, weighted sum (fp64)."""
    batch, seq, heads, dim = q.shape
    out = torch.zeros(batch, seq, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for s in range(seq):
            entries = [kv[b, j] for j in range(max(0, s - window + 1), s + 1)]
            if ratio and ratio != 4:
                entries += [kvc[b, t] for t in range((s + 1) // ratio)]
            elif ratio == 4:
                entries += [kvc[b, t] for t in indices[b, s].tolist() if t >= 0]
            keys = torch.stack(entries).double()
            for h in range(heads):
                logits = keys @ q[b, s, h].double() / math.sqrt(dim)
                weights = torch.exp(logits) / (torch.exp(logits).sum() + torch.exp(sink[h].double()))
                out[b, s, h] = weights @ keys
    return out


@pytest.mark.parametrize("ratio", [0, 4, 5])
def test_sparse_attention_matches_brute_force(ratio: int) -> None:
    gen = torch.Generator().manual_seed(ratio)
    batch, seq, heads, dim, window = 2, 13, 3, 8, 4
    q, kv = torch.randn(batch, seq, heads, dim, generator=gen), torch.randn(batch, seq, dim, generator=gen)
    sink = torch.randn(heads, generator=gen)
    kvc, indices = None, None
    if ratio:
        kvc = torch.randn(batch, seq // ratio, dim, generator=gen)
    if ratio == 4:  # causal random picks, -1 padded, some queries with none
        closed = [(s + 1) // 4 for s in range(seq)]
        indices = torch.full((batch, seq, 2), -1, dtype=torch.int32)
        for b in range(batch):
            for s in range(seq):
                picks = torch.randperm(closed[s], generator=gen)[:2]
                indices[b, s, : len(picks)] = picks.int()
    got = sparse_attention(q, kv, sink, ratio, kvc, indices, window)
    torch.testing.assert_close(got.double(), _brute_attention(q, kv, sink, ratio, kvc, indices, window),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ratio", [4, 3])
def test_compress_pool_matches_a_loop_over_groups(ratio: int) -> None:
    gen = torch.Generator().manual_seed(1)
    batch, seq, dim = 2, 4 * ratio + 2, 5  # a trailing partial group
    coff = 2 if ratio == 4 else 1
    kv, score = (torch.randn(batch, seq, coff * dim, generator=gen) for _ in range(2))
    ape = torch.randn(ratio, coff * dim, generator=gen)
    got = compress_pool(kv, score, ape, ratio)
    assert got.shape == (batch, seq // ratio, dim)
    for b in range(batch):
        for g in range(seq // ratio):
            rows = range(g * ratio, (g + 1) * ratio)
            if coff == 1:
                pairs = [(kv[b, r], score[b, r] + ape[r - g * ratio]) for r in rows]
            else:  # previous group's tokens on the first half, own tokens on the second
                pairs = [(kv[b, r, dim:], score[b, r, dim:] + ape[r - g * ratio, dim:]) for r in rows]
                if g:
                    pairs += [(kv[b, r - ratio, :dim], score[b, r - ratio, :dim] + ape[r - g * ratio, :dim])
                              for r in rows]
            values, scores = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            torch.testing.assert_close(got[b, g], (torch.softmax(scores, 0) * values).sum(0))


def test_indexer_topk_is_causal_padded_and_picks_the_best() -> None:
    gen = torch.Generator().manual_seed(2)
    batch, seq, heads, dim, topk = 2, 17, 3, 8, 3
    q = torch.randn(batch, seq, heads, dim, generator=gen)
    keys, w = torch.randn(batch, seq // 4, dim, generator=gen), torch.rand(batch, seq, heads, generator=gen)
    indices, scores = indexer_topk(q, keys, w, topk)
    assert indices.shape == (batch, seq, topk) and indices.dtype == torch.int32
    for b in range(batch):
        for s in range(seq):
            closed = (s + 1) // 4
            full = [float((w[b, s] * (q[b, s] @ keys[b, t]).relu()).sum()) for t in range(closed)]
            want = sorted(range(closed), key=lambda t: -full[t])[:topk]
            assert sorted(i for i in indices[b, s].tolist() if i >= 0) == sorted(want)
            assert (indices[b, s] == -1).sum() == max(0, topk - closed)


def test_rope_tail_inverts_and_keeps_the_leading_dims() -> None:
    x = torch.randn(2, 5, 3, 128)
    pos = torch.arange(5).expand(2, 5)
    turned = rope_tail(x, pos, 1e4)
    assert torch.equal(turned[..., :64], x[..., :64]) and not torch.allclose(turned, x)
    torch.testing.assert_close(rope_tail(turned, pos, 1e4, inverse=True), x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))


# ----- stages, shapes and training -----------------------------------------------------------


def test_stage_outputs_and_splits_agree_with_one_stage() -> None:
    tokens = _tokens()
    (whole,), _ = _model()
    with torch.no_grad():
        expected = whole(tokens=tokens)
        for layout, pp in (("Et*2|t*2mL", 2), ("Et*4m|L", 2), ("Et|t|t|tmL", 2)):
            stages, parsed = _model(layout, pp=pp)
            args = ()
            for index, stage in enumerate(stages):
                inputs, outputs = stage_io(TINY, parsed, index, 2, SEQ, torch.bfloat16)
                assert [(t.shape, t.dtype) for t in inputs] == [(t.shape, t.dtype) for t in args]
                args = stage(*args, tokens=tokens)
                assert [(t.shape, t.dtype) for t in outputs] == [(t.shape, t.dtype) for t in args]
            assert args[0].shape == (1,) and args[0].dtype == torch.float32
            assert torch.equal(torch.cat(args), torch.cat(expected)), layout
    assert 4.5 < float(expected[0]) < 6.5  # about ln(256) = 5.55 at initialisation


def test_the_loss_falls_over_30_steps() -> None:
    (model,), _ = _model()
    optimizer = MixedPrecisionAdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        optimizer.zero_grad()
        lm, mtp = model(tokens=_tokens(4, iteration=step))
        (lm + TINY.mtp_loss_scale * mtp).sum().backward()
        optimizer.step()
        losses.append(lm.item())
    # from ln(256) = 5.55 towards the chain's ~0.8 nats: about 1.9 lower after 30 steps
    assert losses[-1] < losses[0] - 1.0 and sum(losses[-5:]) < sum(losses[:5]) - 5.0, losses


def test_every_trainable_parameter_gets_a_gradient_and_the_indexer_is_frozen() -> None:
    (model,), _ = _model()
    lm, mtp = model(tokens=_tokens())
    (lm + mtp).sum().backward()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".indexer." in n for n in frozen)
    assert {n for n, p in model.named_parameters() if ".indexer." in n} == frozen
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing


def test_build_stage_rejects_what_does_not_fit() -> None:
    stage = parse_layout("EttttmL", TINY.layers, 1, 1).stages[0]
    with pytest.raises(ValueError, match="Triton expert kernels take bfloat16"):
        build_stage(TINY, stage, RecomputePlan(), "triton", dtype=torch.float32)
    with pytest.raises(ValueError, match="kernels must be one of"):
        build_stage(TINY, stage, RecomputePlan(), "cuda")
    with pytest.raises(RecomputeError, match=r"layer id\(s\) \[7\] out of range"):
        build_stage(TINY, stage, RecomputePlan(frozenset({7})))
    no_mtp = TINY.model_copy(update={"mtp_layers": 0, "compress_ratios": TINY.compress_ratios[:-1]})
    with pytest.raises(ValueError, match="'m' holds layer id 3, tiny has no MTP layer"):
        build_stage(no_mtp, Stage(("E", "t", "m", "L"), (0, 3)), RecomputePlan())
    with pytest.raises(ValueError, match="'t' holds layer id 4, tiny has decoder layers 0..3"):
        build_stage(TINY, Stage(("t", "t"), (3, 4)), RecomputePlan())
    with pytest.raises(ValueError, match="do not match its layer ids"):
        build_stage(TINY, Stage(("t", "t"), (3,)), RecomputePlan())


# ----- recompute -----------------------------------------------------------------------------


def _loss_grads_saved(plan: RecomputePlan) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    (model,), _ = _model(recompute=plan)
    exclude = [*model.parameters(), *model.buffers()]
    with SavedActivations(exclude) as meter:
        lm, mtp = model(tokens=_tokens())
        saved = meter.live_bytes
        (lm + TINY.mtp_loss_scale * mtp).sum().backward()
    assert meter.live_bytes == 0  # every saved tensor is released by the backward
    return torch.cat((lm, mtp)).detach(), _grads(model), saved


def test_recompute_keeps_losses_and_gradients_and_saves_less() -> None:
    loss, grads, saved = _loss_grads_saved(RecomputePlan())
    plans = {text: RecomputePlan.parse(text) for text in (
        "0-4", "1,3", "selective:attn_core", "selective:moe_act", "selective:mhc", "0;selective:attn_core,moe_act,mhc")}
    measured = {}
    for text, plan in plans.items():
        plan_loss, plan_grads, measured[text] = _loss_grads_saved(plan)
        assert torch.equal(plan_loss, loss), text
        assert plan_grads.keys() == grads.keys()
        for name in grads:
            assert torch.equal(plan_grads[name], grads[name]), (text, name)
        assert measured[text] < saved, text
    assert measured["0-4"] < measured["1,3"] < saved
    assert measured["0-4"] < 0.25 * saved  # only each layer's input (and the head) is kept


def test_recompute_text_round_trips_and_errors_name_the_part() -> None:
    plan = RecomputePlan.parse(" 0-3, 7 ;43; selective:mhc,attn_core ")
    assert plan.full_layers == {0, 1, 2, 3, 7, 43} and plan.selective == {"attn_core", "mhc"}
    assert plan.text == "0-3,7,43;selective:attn_core,mhc"
    assert RecomputePlan.parse(plan.text) == plan
    assert RecomputePlan.parse("none") == RecomputePlan.parse("") == RecomputePlan()
    for text, message in (("3-1", "runs backwards"), ("1,x", "'x' in '1,x' is not a layer id"),
                          ("selective:foo", r"unknown module\(s\) \['foo'\]"), ("selective:", "give module names"),
                          ("1;;2", "empty part"), ("attn_core", "need the 'selective:' prefix")):
        with pytest.raises(RecomputeError, match=message):
            RecomputePlan.parse(text)


def test_recompute_from_megatron_knobs() -> None:
    layout = parse_layout("Et*2|t*2mL", 4, 2, 1)
    assert RecomputePlan.from_megatron("full", "uniform", 1, 2, layout).full_layers == {0, 1, 2, 3}
    assert RecomputePlan.from_megatron("full", "block", 1, 2, layout).full_layers == {0, 2}
    selective = RecomputePlan.from_megatron("selective", None, None, 2, layout, modules=("core_attn", "mhc"))
    assert selective == RecomputePlan(selective=frozenset({"attn_core", "mhc"}))
    assert RecomputePlan.from_megatron(None, None, None, 2, layout) == RecomputePlan()
    flash = parse_layout("Et*10|t*12|t*12|t*9mL", 43, 4, 1)
    block = RecomputePlan.from_megatron("full", "block", 3, 4, flash)
    assert block.full_layers == {0, 1, 2, 10, 11, 12, 22, 23, 24, 34, 35, 36}
    for args, message in ((("full", "block", 1, 4, layout), "layout has pp=2"),
                          (("full", "sideways", 1, 2, layout), "method 'uniform' or 'block'"),
                          (("full", "block", 0, 2, layout), "num_layers >= 1"),
                          (("partial", None, None, 2, layout), "granularity must be")):
        with pytest.raises(RecomputeError, match=message):
            RecomputePlan.from_megatron(*args)


# ----- memory meter, optimizer, data, flops ---------------------------------------------------


def test_saved_activations_count_storages_once_and_skip_parameters() -> None:
    weight = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    with SavedActivations(exclude=[weight]) as meter:
        y = x @ weight  # saves x and weight
        z = (x * x).sum() + (y.sigmoid()).sum()  # x again (same storage), and sigmoid's output
        assert meter.total_bytes == x.numel() * 4 + y.numel() * 4
        assert meter.peak_bytes == meter.live_bytes == meter.total_bytes
    z.backward()
    assert meter.live_bytes == 0 and meter.peak_bytes == meter.total_bytes


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused-kernel"])
def test_optimizer_keeps_18_bytes_a_parameter_and_matches_adamw(fused: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    matrix = torch.nn.Parameter(torch.randn(6, 5, generator=gen).to(torch.bfloat16))
    vector = torch.nn.Parameter(torch.randn(5, generator=gen).to(torch.bfloat16))
    optimizer = MixedPrecisionAdamW([vector, matrix], lr=1e-2, weight_decay=0.1, fused=fused)
    n_params = matrix.numel() + vector.numel()
    assert BYTES_PER_PARAM == 18 and 2 * n_params + optimizer.state_bytes() == BYTES_PER_PARAM * n_params
    reference = [torch.nn.Parameter(p.detach().float().clone()) for p in (matrix, vector)]
    adamw = torch.optim.AdamW([{"params": reference[:1], "weight_decay": 0.1},  # decay on matrices only
                               {"params": reference[1:], "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for step in range(3):
        optimizer.zero_grad()
        adamw.zero_grad()
        # two microbatches whose gradients are known exactly: d/dp sum(p * c) = c
        microbatches = [[torch.randn(p.shape, generator=gen).to(torch.bfloat16) for p in (matrix, vector)]
                        for _ in range(2)]
        for coefficients in microbatches:
            sum((p * c).sum() for p, c in zip((matrix, vector), coefficients)).backward()
        assert matrix.grad is None and vector.grad is None  # moved into the fp32 main gradient
        for p, ref, parts in zip((matrix, vector), reference, zip(*microbatches)):
            total = sum(c.float() for c in parts)
            assert torch.equal(p.main_grad, total)
            ref.grad = total.clone()
        optimizer.step()
        adamw.step()
        for p, ref in zip((matrix, vector), reference):
            master = optimizer.master_of(p)
            torch.testing.assert_close(master, ref.detach(), atol=1e-6, rtol=1e-6)
            if fused:  # the interpreter's bf16 rounding is toward zero: within one step of the master
                torch.testing.assert_close(p.detach().float(), master, atol=1e-9, rtol=2.0 ** -7)
            else:
                assert torch.equal(p.detach(), master.to(torch.bfloat16))
    assert clip_coefficient(16.0, 2.0) == pytest.approx(0.5, rel=1e-5)
    assert clip_coefficient(1.0, 2.0) == clip_coefficient(1e9, None) == 1.0


def test_gradient_hook_skips_weights_whose_kernel_wrote_main_grad() -> None:
    # torch 2.11 calls the post-accumulate hook with no .grad for a weight whose autograd Function
    # returned None because the kernel added its gradient into main_grad itself (the expert dW).
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    MixedPrecisionAdamW([weight], lr=1e-2)
    weight.main_grad.fill_(2.0)
    weight.grad = None
    _accumulate(weight)
    assert torch.equal(weight.main_grad, torch.full((3,), 2.0))
    weight.grad = torch.ones(3, dtype=torch.bfloat16)
    _accumulate(weight)
    assert weight.grad is None and torch.equal(weight.main_grad, torch.full((3,), 3.0))


def test_expert_offsets_match_a_count_of_each_expert_including_empty_ones() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        experts = int(torch.randint(1, 9, (), generator=gen))
        expert_of = torch.randint(0, experts, (int(torch.randint(0, 40, (), generator=gen)),), generator=gen)
        counts = torch.tensor([int((expert_of == e).sum()) for e in range(experts)])
        expected = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).int()
        assert torch.equal(expert_offsets(expert_of.sort().values, experts), expected)


def test_markov_tokens_are_seeded_and_follow_the_chain() -> None:
    data = MarkovTokens(TINY.vocab, seed=0)
    first = data.batch(3, 0, 4, SEQ)
    assert first.shape == (4, SEQ + 2) and torch.equal(first, MarkovTokens(TINY.vocab, seed=0).batch(3, 0, 4, SEQ))
    assert not torch.equal(first, data.batch(3, 1, 4, SEQ)) and not torch.equal(first, data.batch(4, 0, 4, SEQ))
    allowed = data.successors[first[:, :-1]]
    assert (allowed == first[:, 1:, None]).any(-1).all()
    assert 0.3 < data.entropy() < math.log(4) < math.log(TINY.vocab)


def _brute_entries(config, layer_id: int, seq: int) -> float:
    ratio, kind = config.compress_ratios[layer_id], config.attention_type(layer_id)
    total = 0
    for s in range(seq):
        total += min(s + 1, config.window)
        closed = (s + 1) // ratio if ratio else 0
        total += {"window": 0, "hca": closed, "csa": min(config.indexer_topk, closed)}[kind]
    return total / seq


@pytest.mark.parametrize("seq", [7, 64, 301])
def test_flops_count_the_attended_entries_and_the_experts(seq: int) -> None:
    c = TINY
    for layer_id in c.layer_ids:
        flops = layer_flops(c, layer_id, seq)
        expected_core = 2 * _brute_entries(c, layer_id, seq) * c.heads * 2 * c.head_dim
        assert flops.attention_core == pytest.approx(expected_core)
        assert flops.moe == 2 * c.hidden * c.experts + 6 * c.hidden * c.expert_ffn * (c.experts_per_token + 1)
        assert (flops.indexer > 0) == (c.attention_type(layer_id) == "csa")
    total = model_flops(c, seq)
    assert total.training == pytest.approx(3 * total.forward - 2 * total.indexer)
    assert (total + Flops()).forward == total.forward
    flash = model_flops(load_preset("v4-flash"), 4096)
    assert 26e9 < flash.forward < 34e9  # about 2 x 13B active parameters, plus attention


# ----- Triton kernels on single layers -------------------------------------------------------


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("layer_id", [1, 2])  # CSA with hash routing; HCA with learned routing
def test_triton_layer_matches_eager(layer_id: int) -> None:
    """One forward/backward per layer: the interpreter is far too slow to train the model with."""
    seq, device = 16, kernel_device()  # the CPU under the interpreter, else the GPU
    tokens = _tokens(1, seq)[:, :seq].to(device)
    h = torch.randn(1, seq, 4, TINY.hidden, generator=torch.Generator().manual_seed(4)).to(device, torch.bfloat16)
    results = {}
    for kernels in ("eager", "triton"):
        layer = build_layer(TINY, layer_id, kernels, device=device)
        h_in = h.clone().requires_grad_()
        out = layer(h_in, tokens)
        out.float().square().sum().backward()
        results[kernels] = out.detach(), h_in.grad, _grads(layer)
    (out_e, dh_e, grads_e), (out_t, dh_t, grads_t) = results["eager"], results["triton"]
    torch.testing.assert_close(out_t.float(), out_e.float(), atol=0.05, rtol=0.05)
    assert _cosine(dh_t, dh_e) > 0.999
    assert grads_t.keys() == grads_e.keys()
    for name in grads_e:  # bf16 rounding (truncation under the interpreter) differs, directions agree
        assert _cosine(grads_t[name], grads_e[name]) > 0.99, name


def test_triton_layer_recomputing_its_mhc_keeps_its_gradients() -> None:
    """Selective mHC recompute checkpoints the entry (``mhc_enter``, which hands h on to the expand) and
    the expand apart: the gradients match the layer's without recompute."""
    seq, device = 16, kernel_device()
    tokens = _tokens(1, seq)[:, :seq].to(device)
    h = torch.randn(1, seq, 4, TINY.hidden, generator=torch.Generator().manual_seed(6)).to(device, torch.bfloat16)
    results = []
    for plan in (RecomputePlan(), RecomputePlan.parse("selective:mhc")):
        layer = build_layer(TINY, 1, "triton", recompute=plan, device=device)
        h_in = h.clone().requires_grad_()
        out = layer(h_in, tokens)
        out.float().square().sum().backward()
        results.append((out.detach(), h_in.grad, _grads(layer)))
    (out, dh, grads), (out_r, dh_r, grads_r) = results
    torch.testing.assert_close(out_r, out)
    torch.testing.assert_close(dh_r, dh)
    assert grads_r.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_r[name], grads[name], msg=name)


def test_grouped_projection_is_the_einsum_and_hands_back_contiguous_gradients() -> None:
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(10, 4, 6, generator=gen), torch.randn(4, 3, 6, generator=gen)
    dy = torch.randn(10, 4, 3, generator=gen)
    ours, theirs = (x.clone().requires_grad_(), w.clone().requires_grad_()), (x.clone().requires_grad_(),
                                                                               w.clone().requires_grad_())
    y = grouped_projection(*ours)
    y.backward(dy)
    expected = torch.einsum("tgi,goi->tgo", *theirs)
    expected.backward(dy)
    torch.testing.assert_close(y, expected)
    for got, ref in zip(ours, theirs):
        torch.testing.assert_close(got.grad, ref.grad)
        assert got.grad.is_contiguous()
    with pytest.raises(ValueError, match=r"contiguous x \[T, G, I\] and w \[G, O, I\], got \[10, 4, 6\] and \[3, 3, 6\]"):
        grouped_projection(x, w[:3])


def test_triton_head_matches_eager() -> None:
    """The head's losses (LM and MTP) through the cross-entropy kernel against the eager head's."""
    seq, device = 16, kernel_device()
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(1, seq, 4, TINY.hidden, generator=gen).to(device, torch.bfloat16)
    mtp_x = torch.randn(1, seq, TINY.hidden, generator=gen).to(device, torch.bfloat16)
    labels, mtp_labels = (torch.randint(0, TINY.vocab, (1, seq), generator=gen).to(device) for _ in range(2))
    results = {}
    for kernels in ("eager", "triton"):
        head = build_head(TINY, kernels, device=device)
        h_in, x_in = h.clone().requires_grad_(), mtp_x.clone().requires_grad_()
        lm, mtp = head(h_in, labels, x_in, mtp_labels)
        (lm + 0.3 * mtp).sum().backward()
        results[kernels] = torch.cat([lm, mtp]).detach(), h_in.grad, x_in.grad, head.weight.grad
    for got, expected in zip(results["triton"], results["eager"]):
        assert _cosine(got, expected) > 0.999
    torch.testing.assert_close(results["triton"][0], results["eager"][0], atol=1e-4, rtol=1e-4)


def test_triton_ops_are_the_kernels_wherever_a_kernel_exists() -> None:
    """Every op of the ``triton`` table but RoPE on the indexer's 128-wide heads (no kernel) is a
    project kernel, not its eager reference: until 2026-12-01 the attention-side kernels had landed
    but were never swapped in, and every "triton" run attended eagerly."""
    eager, triton_ops = get_ops("eager"), get_ops("triton")
    same = {f.name for f in dataclasses.fields(triton_ops) if getattr(triton_ops, f.name) is getattr(eager, f.name)}
    assert same == {"indexer_rope"}
