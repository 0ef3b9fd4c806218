"""masked_logsumexp by arithmetic (no masked fill): the same values and gradients, to the bit,
as the fill-with-the-smallest-float formula it replaced, on finite scores."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl.losses._common import masked_logsumexp


def filled_logsumexp(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """The former implementation: left-out entries filled with the smallest float."""
    neg_inf = torch.finfo(x.dtype).min
    filled = x.masked_fill(~mask, neg_inf)
    peak = filled.amax(dim=dim, keepdim=True).detach()
    peak = torch.where(torch.isfinite(peak) & (peak > neg_inf), peak, torch.zeros_like(peak))
    summed = (torch.exp(filled - peak) * mask).sum(dim=dim, keepdim=True)
    return (torch.log(summed) + peak).squeeze(dim)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), dim=st.sampled_from([0, 1]),
       scale=st.sampled_from([0.1, 10.0, 200.0]), broadcast=st.booleans(),
       double=st.booleans(), seed=st.integers(0, 2**16))
def test_values_and_gradients_equal_the_filled_formula(rows: int, cols: int, dim: int,
                                                       scale: float, broadcast: bool,
                                                       double: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    x = (torch.randn(rows, cols, generator=g) * scale).to(dtype)
    shape = (1, cols) if broadcast and dim == 1 else (rows, cols)
    mask = torch.rand(shape, generator=g) < 0.6
    if not broadcast:
        mask[0] = False  # a row (or column entry) with nothing selected
    upstream = torch.randn(rows if dim == 1 else cols, generator=g).to(dtype)
    values, grads = [], []
    for formula in (masked_logsumexp, filled_logsumexp):
        leaf = x.clone().requires_grad_()
        out = formula(leaf, mask, dim)
        values.append(out.detach())
        finite = torch.isfinite(out)
        (out[finite] * upstream[finite]).sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(values[0], values[1])
    assert torch.equal(grads[0], grads[1])


def test_no_mask_is_logsumexp() -> None:
    x = torch.randn(4, 5)
    assert torch.equal(masked_logsumexp(x, None, dim=1), torch.logsumexp(x, dim=1))
