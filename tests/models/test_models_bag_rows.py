"""The gathered-rows bag (crl.models.bag_rows): means and gradients against a reference written
from the formula (each text's mean of its non-pad rows) and against nn.EmbeddingBag."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from crl.models.bag_rows import bag_rows, gathered_mean


def reference_bags(table: torch.Tensor, ids: torch.Tensor, pad: int) -> torch.Tensor:
    """Each text's mean of the table rows of its non-pad ids; zeros for a text without any."""
    out = torch.zeros(ids.shape[0], table.shape[1], dtype=table.dtype)
    for b, text in enumerate(ids.tolist()):
        kept = [t for t in text if t != pad]
        for t in kept:
            out[b] += table[t] / len(kept)
    return out


def reference_grad(table: torch.Tensor, ids: torch.Tensor, pad: int,
                   upstream: torch.Tensor) -> torch.Tensor:
    """d(sum(bags * upstream))/d table: each occurrence of row t in text b adds
    upstream[b] / (non-pad tokens of b)."""
    grad = torch.zeros_like(table)
    for b, text in enumerate(ids.tolist()):
        kept = [t for t in text if t != pad]
        for t in kept:
            grad[t] += upstream[b] / len(kept)
    return grad


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), length=st.integers(1, 7), vocab=st.integers(2, 12),
       pad=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_means_and_gradients_equal_the_formula(batch: int, length: int, vocab: int, pad: int,
                                               seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)  # repeats, pads, empty texts
    table = torch.randn(vocab, 3, dtype=torch.float64, generator=g).requires_grad_()
    upstream = torch.randn(batch, 3, dtype=torch.float64, generator=g)
    rows = bag_rows(ids, pad, torch.float64)
    bags = gathered_mean(table, rows)
    torch.testing.assert_close(bags, reference_bags(table.detach(), ids, pad), rtol=1e-12,
                               atol=1e-12)
    (bags * upstream).sum().backward()
    grad = table.grad
    assert grad is not None and grad.is_sparse
    # one entry per distinct row, sorted (autograd's accumulation drops the coalesced flag)
    present = sorted({t for t in ids.reshape(-1).tolist() if t != pad})
    assert grad._indices().reshape(-1).tolist() == present == rows.rows.tolist()
    torch.testing.assert_close(grad.to_dense(),
                               reference_grad(table.detach(), ids, pad, upstream),
                               rtol=1e-12, atol=1e-12)


def test_equals_nn_embedding_bag_in_float32() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 200, (32, 20), generator=g)
    ids[:, 12:] = 0
    ids[5] = 0  # a text without tokens
    bag = nn.EmbeddingBag(200, 8, mode="mean", padding_idx=0, sparse=True)
    upstream = torch.randn(32, 8, generator=g)
    (bag(ids) * upstream).sum().backward()
    expected = bag.weight.grad.coalesce().to_dense()
    ours = bag.weight.detach().clone().requires_grad_()
    out = gathered_mean(ours, bag_rows(ids, 0))
    torch.testing.assert_close(out, bag(ids), rtol=1e-6, atol=1e-6)
    assert torch.equal(out[5], torch.zeros(8))
    (out * upstream).sum().backward()
    torch.testing.assert_close(ours.grad.to_dense(), expected, rtol=1e-5, atol=1e-6)


def test_one_batch_rows_serve_several_tables() -> None:
    """A group's runs share the batch's rows; each table gets its own gradient."""
    ids = torch.tensor([[3, 4, 4, 0], [2, 0, 0, 0]])
    rows = bag_rows(ids, 0)
    tables = [torch.randn(6, 2, requires_grad=True) for _ in range(3)]
    outs = [gathered_mean(t, rows) for t in tables]
    sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
    for i, t in enumerate(tables):
        assert t.grad is not None
        torch.testing.assert_close(t.grad.to_dense(),
                                   reference_grad(t.detach(), ids, 0,
                                                  torch.full((2, 2), float(i + 1))))


def test_no_gradient_without_grad() -> None:
    table = torch.randn(5, 2, requires_grad=True)
    with torch.no_grad():
        out = gathered_mean(table, bag_rows(torch.tensor([[1, 2]]), 0))
    assert not out.requires_grad
    torch.testing.assert_close(out, (table[1] + table[2]).unsqueeze(0).detach() / 2)
