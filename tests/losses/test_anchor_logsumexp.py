"""``anchor_logsumexp``: some anchors (a rank's local rows) against all candidates, the positive
of anchor i at column ``offset + i``, optional extra (hard-negative) candidates of each anchor;
the plain and the tiled path against a loop reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from loss_reference import ref_logsumexp
from torch import Tensor

from crl.errors import CrlTypeError, CrlValueError
from crl.losses import anchor_logsumexp, info_nce
from crl.negatives import NegativeSets


def _reference(anchors: Tensor, candidates: Tensor, scale: Tensor, offset: int,
               include_positive: bool, mask: Tensor | None, extra: Tensor | None = None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """Loops over anchors and candidates, straight from the definition; anchor ``i``'s extra
    candidates are ``extra[i]``."""
    lses, positives, counts = [], [], []
    for i in range(anchors.shape[0]):
        s_i = scale[i] if scale.dim() == 1 else scale
        logit = [s_i * (anchors[i] * candidates[j]).sum() for j in range(candidates.shape[0])]
        chosen = [logit[j] for j in range(candidates.shape[0])
                  if (j == offset + i and include_positive)
                  or (j != offset + i and (mask is None or bool(mask[i, j])))]
        if extra is not None:
            chosen += [s_i * (anchors[i] * extra[i, k]).sum() for k in range(extra.shape[1])]
        lses.append(ref_logsumexp(chosen) if chosen else torch.tensor(-math.inf,
                                                                        dtype=torch.float64))
        positives.append(logit[offset + i])
        counts.append(len(chosen))
    return torch.stack(lses), torch.stack(positives), torch.tensor(counts)


def _case(seed: int, h: int, width: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, 5, generator=g, dtype=torch.float64),
            torch.randn(width, 5, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("block_size", [None, 2, 3, 64])
@pytest.mark.parametrize("include_positive", [True, False])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("offset", [0, 3, 7])
def test_values_and_gradients_equal_the_loop_reference(block_size: int | None,
                                                       include_positive: bool, masked: bool,
                                                       offset: int) -> None:
    h, width = 4, 11
    anchors, candidates = _case(offset + 10 * masked, h, width)
    mask = torch.rand(h, width, generator=torch.Generator().manual_seed(offset)) < 0.5 \
        if masked else None
    if mask is not None:
        mask[1] = False  # an anchor with no negative: -inf without the positive
    got_inputs = [x.clone().requires_grad_(True) for x in (anchors, candidates)]
    scale = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    out = anchor_logsumexp(*got_inputs, scale, offset=offset, include_positive=include_positive,
                           negatives_mask=mask, block_size=block_size)
    ref_inputs = [x.clone().requires_grad_(True) for x in (anchors, candidates)]
    ref_scale = scale.detach().clone().requires_grad_(True)
    lse, positive, counts = _reference(*ref_inputs, ref_scale, offset, include_positive, mask)
    assert torch.equal(out.counts, counts)
    torch.testing.assert_close(out.lse, lse.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.positive, positive.detach(), rtol=1e-12, atol=1e-12)
    # a loss that uses every finite output, weighted so that no gradient term cancels
    weights = torch.linspace(0.5, 1.5, h, dtype=torch.float64)
    finite = counts > 0
    total = (weights[finite] * (out.lse[finite] - 0.7 * out.positive[finite])).sum()
    ref_total = (weights[finite] * (lse[finite] - 0.7 * positive[finite])).sum()
    got = torch.autograd.grad(total, [*got_inputs, scale])
    want = torch.autograd.grad(ref_total, [*ref_inputs, ref_scale])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 3])
def test_a_tile_mask_is_asked_with_the_anchor_and_candidate_indices(block_size: int | None
                                                                    ) -> None:
    sets = NegativeSets(50, 6, regime="independent", seed=2)
    index = torch.tensor([3, 17, 29, 41, 8, 22, 35, 49, 0])
    anchors, candidates = _case(1, 3, 9)
    rows = slice(4, 7)
    got = anchor_logsumexp(anchors, candidates, 1.0, offset=4, negatives_mask=sets,
                           anchor_index=index[rows], candidate_index=index,
                           block_size=block_size)
    dense = sets.mask(index[rows], index)
    want = anchor_logsumexp(anchors, candidates, 1.0, offset=4, negatives_mask=dense)
    assert torch.equal(got.counts, want.counts)
    torch.testing.assert_close(got.lse, want.lse, rtol=1e-12, atol=0.0)


def test_per_anchor_scales_match_the_reference() -> None:
    anchors, candidates = _case(5, 3, 8)
    scale = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)
    for block_size in (None, 2):
        out = anchor_logsumexp(anchors, candidates, scale, offset=2, include_positive=False,
                               block_size=block_size)
        lse, positive, _ = _reference(anchors, candidates, scale, 2, False, None)
        torch.testing.assert_close(out.lse, lse, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out.positive, positive, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 4), local=st.integers(1, 5), seed=st.integers(0, 10_000),
       block=st.sampled_from([None, 1, 2, 5]))
def test_rank_slices_add_up_to_the_whole_batch_info_nce(world: int, local: int, seed: int,
                                                        block: int | None) -> None:
    # Each rank's rows against all columns, with the positive at offset r * local: the mean
    # over ranks of their local means is InfoNCE of the whole batch.
    batch = world * local
    if batch < 2:
        return
    a, b = _case(seed, batch, batch)
    parts = []
    for r in range(world):
        rows = slice(r * local, (r + 1) * local)
        out = anchor_logsumexp(a[rows], b, 4.0, offset=r * local, block_size=block)
        parts.append((out.lse - out.positive).mean())
    torch.testing.assert_close(torch.stack(parts).mean(), info_nce(a, b, temperature=0.25),
                               rtol=1e-12, atol=1e-12)


def test_bad_input_names_the_argument() -> None:
    anchors, candidates = _case(0, 3, 5)
    with pytest.raises(CrlValueError, match="offset"):
        anchor_logsumexp(anchors, candidates, 1.0, offset=3)
    with pytest.raises(CrlValueError, match="offset"):
        anchor_logsumexp(anchors, candidates, 1.0, offset=-1)
    with pytest.raises(CrlValueError, match="same width"):
        anchor_logsumexp(anchors, candidates[:, :4], 1.0)
    with pytest.raises(CrlValueError, match="negatives_mask"):
        anchor_logsumexp(anchors, candidates, 1.0, negatives_mask=torch.ones(3, 4, dtype=bool))
    with pytest.raises(CrlTypeError, match="negatives_mask"):
        anchor_logsumexp(anchors, candidates, 1.0, negatives_mask="all")  # type: ignore[arg-type]
    with pytest.raises(CrlValueError, match="scale"):
        anchor_logsumexp(anchors, candidates, torch.ones(2, dtype=torch.float64))
    with pytest.raises(CrlValueError, match="scale"):
        anchor_logsumexp(anchors, candidates, 0.0)
    with pytest.raises(CrlValueError, match="anchors"):
        anchor_logsumexp(anchors.fill_(math.nan), candidates, 1.0)


@pytest.mark.parametrize("block_size", [None, 2, 64])
@pytest.mark.parametrize("include_positive", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_extra_candidates_equal_the_loop_reference(block_size: int | None,
                                                   include_positive: bool, masked: bool) -> None:
    """Each anchor's hard negatives ``extra[i] (H, D)`` enter its own log-sum-exp and count,
    never another anchor's; gradients reach ``extra``, the embeddings and the scale."""
    h, width, hard, offset = 4, 9, 3, 2
    anchors, candidates = _case(7 + masked, h, width)
    extra = torch.randn(h, hard, 5, generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64)
    mask = torch.rand(h, width, generator=torch.Generator().manual_seed(1)) < 0.5 \
        if masked else None
    if mask is not None:
        mask[1] = False  # no in-batch negative: the extra candidates are all it has
    scale = torch.tensor([0.5, 2.0, 3.0, 7.0], dtype=torch.float64)
    got_inputs = [x.clone().requires_grad_(True) for x in (anchors, candidates, extra, scale)]
    out = anchor_logsumexp(got_inputs[0], got_inputs[1], got_inputs[3], offset=offset,
                           include_positive=include_positive, negatives_mask=mask,
                           block_size=block_size, extra=got_inputs[2])
    ref_inputs = [x.clone().requires_grad_(True) for x in (anchors, candidates, extra, scale)]
    lse, positive, counts = _reference(ref_inputs[0], ref_inputs[1], ref_inputs[3], offset,
                                       include_positive, mask, ref_inputs[2])
    assert torch.equal(out.counts, counts)
    torch.testing.assert_close(out.lse, lse.detach(), rtol=1e-12, atol=1e-12)
    weights = torch.linspace(0.5, 1.5, h, dtype=torch.float64)
    got = torch.autograd.grad((weights * (out.lse - 0.7 * out.positive)).sum(), got_inputs)
    want = torch.autograd.grad((weights * (lse - 0.7 * positive)).sum(), ref_inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    # anchor 0's extra candidates move anchor 0's log-sum-exp only
    moved = extra.clone()
    moved[0] += 1.0
    again = anchor_logsumexp(anchors, candidates, scale, offset=offset,
                             include_positive=include_positive, negatives_mask=mask,
                             block_size=block_size, extra=moved)
    assert float((again.lse[0] - out.lse[0].detach()).abs()) > 1e-3
    torch.testing.assert_close(again.lse[1:], out.lse[1:].detach(), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck_with_extra_candidates(block_size: int | None) -> None:
    anchors, candidates = _case(11, 3, 6)
    extra = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scale = torch.tensor(1.5, dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True, False, True]] * 3)

    def loss(a: Tensor, c: Tensor, e: Tensor, s: Tensor) -> Tensor:
        out = anchor_logsumexp(a, c, s, offset=1, negatives_mask=mask, extra=e,
                               block_size=block_size)
        return (out.lse - out.positive).sum()

    inputs = tuple(x.clone().requires_grad_(True) for x in (anchors, candidates, extra, scale))
    assert torch.autograd.gradcheck(loss, inputs)


def test_bad_extra_names_the_argument() -> None:
    anchors, candidates = _case(0, 3, 5)
    with pytest.raises(CrlValueError, match=r"`extra` must have shape \(h, H, D\) = \(3, H, 5\)"):
        anchor_logsumexp(anchors, candidates, 1.0, extra=torch.zeros(2, 1, 5, dtype=torch.float64))
    with pytest.raises(CrlValueError, match="extra"):
        anchor_logsumexp(anchors, candidates, 1.0, extra=torch.zeros(3, 5, dtype=torch.float64))
