"""The LM head's cross entropy: parity with PyTorch's on fp32-widened logits (forward and gradient,
ragged rows and vocabularies, strided rows), tuned configs, and the contract."""

from __future__ import annotations

import pytest
import torch

from kernels import cross_entropy as cross_entropy_module
from kernels import registry
from kernels.arch import kernel_device
from kernels.cross_entropy import cross_entropy, cross_entropy_reference
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space,
                                 assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()


def _problem(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows, vocab, generator=gen)).to(DEVICE, dtype)
    return logits, torch.randint(0, vocab, (rows,), generator=gen).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("rows", "vocab"), [(7, 1000), (1, 5), (33, 4097), (3, 20000)])
def test_loss_and_gradient_match_pytorch(rows, vocab, dtype):
    logits, labels = _problem(rows, vocab, dtype, seed=rows + vocab)
    ours, theirs = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    loss, expected = cross_entropy(ours, labels), cross_entropy_reference(theirs, labels)
    (2.5 * loss).backward()  # a loss gradient other than one reaches every row
    (2.5 * expected).backward()
    assert loss.shape == () and loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    assert ours.grad.dtype == dtype
    step = {torch.bfloat16: 2.0 ** -8, torch.float32: 1e-6}[dtype]  # one rounding of the gradient
    torch.testing.assert_close(ours.grad.float(), theirs.grad.float(), atol=step * 2.5 / rows, rtol=2 * step)


def test_rows_may_be_strided_and_every_row_is_its_own():
    """Rows of a wider buffer (the head's logits sliced per loss) are read at their stride; a row's
    gradient is its own softmax less its own label."""
    wide, labels = _problem(6, 300, torch.float32, seed=1)
    logits = wide[:, :257]
    assert not logits.is_contiguous()
    ours = logits.detach().clone().requires_grad_()
    loss = cross_entropy(wide[:, :257], labels % 257)
    torch.testing.assert_close(loss, cross_entropy_reference(logits, labels % 257), atol=1e-5, rtol=1e-5)
    cross_entropy(ours, labels % 257).backward()
    expected = (torch.softmax(logits, -1) - torch.nn.functional.one_hot(labels % 257, 257)) / 6
    torch.testing.assert_close(ours.grad, expected, atol=1e-7, rtol=1e-5)


CONFIGS = [
    {"BLOCK_V": 256, "num_warps": 1, "num_stages": 1},   # many chunks, a ragged last one
    {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 2},
    {"BLOCK_V": 8192, "num_warps": 8, "num_stages": 3},  # wider than the small rows: one masked chunk
]


@pytest.mark.parametrize("name", ["cross_entropy_fwd", "cross_entropy_bwd"])
@pytest.mark.parametrize("config", CONFIGS)
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=3)


@pytest.mark.parametrize("name", ["cross_entropy_fwd", "cross_entropy_bwd"])
def test_defaults_fit_the_space_and_inputs_are_seeded(name):
    assert_defaults_fit_space(name, grid_points=True)
    kernel = registry.get(name)
    assert_seeded_random_inputs(kernel, kernel.presets["small"][0], integers_nonzero=False)


def test_forward_and_backward_ask_the_table_at_their_shape(monkeypatch):
    asked = spy_on_resolve(monkeypatch, cross_entropy_module)
    logits, labels = _problem(7, 1000, torch.bfloat16, seed=2)
    cross_entropy(logits.requires_grad_(), labels).backward()
    assert asked == [("cross_entropy_fwd", "rows=7,vocab=1000"), ("cross_entropy_bwd", "rows=7,vocab=1000")]


@pytest.mark.parametrize(("logits", "labels", "message"), [
    (torch.zeros(4, 10, dtype=torch.int32), torch.zeros(4, dtype=torch.long), "logits must be a non-empty float"),
    (torch.zeros(0, 10), torch.zeros(0, dtype=torch.long), "logits must be a non-empty float"),
    (torch.zeros(4, 10, 2), torch.zeros(4, dtype=torch.long), "logits must be a non-empty float"),
    (torch.zeros(10, 4).t(), torch.zeros(4, dtype=torch.long), "contiguous columns"),
    (torch.zeros(4, 10), torch.zeros(4), "labels must be int32 or int64"),
    (torch.zeros(4, 10), torch.zeros(3, dtype=torch.long), r"labels must be \[4\]"),
    (torch.zeros(4, 10), torch.tensor([0, 1, 10, 2]), r"labels must hold vocabulary ids in \[0, 9\], got 10"),
    (torch.zeros(4, 10), torch.tensor([0, -1, 1, 2]), r"got -1"),
])
def test_the_contract_is_kept(logits, labels, message):
    with pytest.raises(ValueError, match=message):
        cross_entropy(logits.to(DEVICE), labels.to(DEVICE))
