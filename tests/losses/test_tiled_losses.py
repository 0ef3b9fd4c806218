"""The tiled losses equal the plain ones (value and every gradient), and their inputs are checked.

The plain losses of ``crl.losses.functional.infonce`` are themselves tested against the float64
loop references (``test_losses_parity.py``); here ``info_nce`` / ``clip_loss`` with a ``block_size``
(the tiled kernel) are compared with them, the negatives-only log-sum-exp of
:func:`crl.losses.anchor_logsumexp` with a dense formula written from docs/theory.md §10, and
bfloat16 inputs (bf16 products, float32 reductions) with float64.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from loss_reference import ref_info_nce
from torch import Tensor

import crl.losses._tiled_kernel as kernel_module
import crl.losses.tiled as tiled_module
from crl.errors import CrlTypeError, CrlValueError
from crl.losses import TileMask, anchor_logsumexp, clip_loss, info_nce
from crl.losses._tile_math import TileGradient, direct_weights, tile_logsumexps
from crl.losses._tile_negatives import TileNegatives
from crl.negatives import NegativeSets
from shared_tensors import make_pair

F32 = {"rtol": 1e-5}
F64 = {"rtol": 1e-10}


class HashMask:
    """A deterministic TileMask: ``j`` is a negative of ``i`` iff ``(7 i + 3 j) % 5 != 0``."""

    def __init__(self) -> None:
        self.calls = 0

    def mask(self, rows_index: Tensor, cols_index: Tensor, /) -> Tensor:
        self.calls += 1
        return (7 * rows_index.unsqueeze(1) + 3 * cols_index.unsqueeze(0)) % 5 != 0


def _pair(batch: int, dim: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, Tensor]:
    """Unit-norm pairs whose positives are correlated with their anchors (a trained-like loss)."""
    return make_pair(batch, dim, seed=seed, noise=0.7, normalize=True, dtype=dtype,
                     requires_grad=True)


def _assert_same(got: Tensor, want: Tensor, rtol: float) -> None:
    """Equal to ``rtol`` relative to the tensor's scale: in norm, and element by element with an
    absolute slack of ``rtol * max|want|`` (entries near 0 are sums that cancel)."""
    scale = float(want.abs().max())
    assert float((got - want).norm()) <= rtol * float(want.norm()) + 1e-300
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale)


def _losses_and_grads(fn, a: Tensor, b: Tensor, t: Tensor) -> list[Tensor]:  # type: ignore[no-untyped-def]
    loss = fn(a, b, t)
    return [loss.detach(), *torch.autograd.grad(loss, (a, b, t))]


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "dense", "object", "object_per_tile"])
@pytest.mark.parametrize("temperature", [0.005, 0.3])
def test_tiled_info_nce_equals_plain(dtype: torch.dtype, rtol: float, symmetric: bool,
                                     mask_kind: str, temperature: float,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    batch, block = 53, 16  # 53 = 3 * 16 + 5: the last row and column tiles are partial
    a, b = _pair(batch, 12, dtype, seed=3)
    tau = torch.tensor(temperature, dtype=dtype, requires_grad=True)
    hashed = HashMask()
    index = torch.randperm(batch, generator=torch.Generator().manual_seed(1)) + 100
    dense = hashed.mask(index, index)
    plain_mask = None if mask_kind == "none" else dense
    tiled_mask = {"none": None, "dense": dense}.get(mask_kind, hashed)
    if mask_kind == "object_per_tile":  # never made dense: asked for every tile and pass
        monkeypatch.setattr(tiled_module, "DENSE_MASK_MAX_ENTRIES", 0)

    want = _losses_and_grads(
        lambda x, y, t: info_nce(x, y, temperature=t, symmetric=symmetric,
                                 negatives_mask=plain_mask), a, b, tau)
    got = _losses_and_grads(
        lambda x, y, t: info_nce(x, y, temperature=t, symmetric=symmetric,
                                 negatives_mask=tiled_mask, index=index,
                                 block_size=block), a, b, tau)
    for g, w in zip(got, want, strict=True):
        _assert_same(g, w, rtol)
    if mask_kind == "object":
        assert hashed.calls == 1 + 1  # made dense once for forward and backward, + `dense`
    if mask_kind == "object_per_tile":
        assert hashed.calls == 2 * 4 * 4 + 1  # forward + backward over 4 x 4 tiles, + `dense`


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("block", [1, 7, 32, 40, 1000])
def test_tiled_clip_loss_equals_plain(dtype: torch.dtype, rtol: float, block: int) -> None:
    a, b = _pair(40, 8, dtype, seed=block)
    scale = torch.tensor(1 / 0.005, dtype=dtype, requires_grad=True)
    want = _losses_and_grads(lambda x, y, s: clip_loss(x, y, s), a, b, scale)
    got = _losses_and_grads(lambda x, y, s: clip_loss(x, y, s, block_size=block), a, b, scale)
    for g, w in zip(got, want, strict=True):
        _assert_same(g, w, rtol)


def test_tiled_info_nce_matches_the_loop_reference() -> None:
    a, b = _pair(9, 4, torch.float64, seed=5)
    mask = HashMask().mask(torch.arange(9), torch.arange(9))
    got = info_nce(a, b, temperature=0.2, symmetric=True, negatives_mask=mask, block_size=4)
    want = ref_info_nce(a, b, 0.2, symmetric=True, negatives_mask=mask)
    torch.testing.assert_close(got, want, **F64, atol=1e-12)


def test_negative_sets_as_tile_mask_equals_its_batch_mask() -> None:
    sets = NegativeSets(500, 40, regime="independent", seed=2)
    assert isinstance(sets, TileMask)
    index = torch.randperm(500, generator=torch.Generator().manual_seed(0))[:70]
    a, b = _pair(70, 6, torch.float64, seed=8)
    kwargs = {"temperature": 0.1, "symmetric": True}
    plain = info_nce(a, b, negatives_mask=sets.batch_mask(index), **kwargs)
    tiled = info_nce(a, b, negatives_mask=sets, index=index, block_size=16, **kwargs)
    via_plain_path = info_nce(a, b, negatives_mask=sets, index=index, **kwargs)  # B <= 2048
    torch.testing.assert_close(tiled, plain, **F64, atol=0.0)
    torch.testing.assert_close(via_plain_path, plain, rtol=0.0, atol=0.0)


def _ref_negative_lse(a: Tensor, b: Tensor, scale: Tensor, mask: Tensor) -> Tensor:
    """``log sum_{j in neg(i)} exp(scale_i (s_ij - s_ii))`` from its formula, dense."""
    s = a @ b.T
    delta = (s - s.diagonal().unsqueeze(1)) * (scale.unsqueeze(1) if scale.dim() else scale)
    neg = mask & ~torch.eye(a.shape[0], dtype=torch.bool)
    return torch.logsumexp(delta.masked_fill(~neg, -math.inf), dim=1)


@pytest.mark.parametrize("per_anchor_scale", [False, True])
@pytest.mark.parametrize("direction", ["a2b", "b2a"])
def test_negatives_only_logsumexp_equals_formula(per_anchor_scale: bool, direction: str) -> None:
    batch = 23
    a, b = _pair(batch, 5, torch.float64, seed=11)
    gen = torch.Generator().manual_seed(4)
    mask = torch.rand(batch, batch, generator=gen) < 0.3
    mask[3] = False  # an anchor with no negative: -inf, count 0
    if direction == "b2a":  # the other direction of GCL: candidate j as the anchor
        a, b, mask = b, a, mask.T.contiguous()
        mask[3] = False
    if per_anchor_scale:
        scale = (1.0 + 30 * torch.rand(batch, generator=gen, dtype=torch.float64))
    else:
        scale = torch.tensor(50.0, dtype=torch.float64)
    scale.requires_grad_(True)
    out = anchor_logsumexp(a, b, scale, include_positive=False, negatives_mask=mask,
                           block_size=6)
    rows = out.lse - out.positive
    want = _ref_negative_lse(a, b, scale, mask)
    torch.testing.assert_close(rows, want, **F64, atol=1e-13)
    assert out.counts.tolist() == (mask & ~torch.eye(batch, dtype=torch.bool)).sum(1).tolist()
    assert out.lse[3] == -math.inf
    finite = torch.isfinite(want)
    weights = torch.linspace(0.5, 2.0, batch, dtype=torch.float64)[finite]
    got_grads = torch.autograd.grad((rows[finite] * weights).sum(), (a, b, scale))
    want_grads = torch.autograd.grad((want[finite] * weights).sum(), (a, b, scale))
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, **F64, atol=1e-12)


def test_negatives_only_default_negatives_and_tile_mask() -> None:
    a, b = _pair(17, 4, torch.float32, seed=2)
    out = anchor_logsumexp(a, b, 20.0, include_positive=False, block_size=5)
    want = _ref_negative_lse(a.double(), b.double(), torch.tensor(20.0, dtype=torch.float64),
                             torch.ones(17, 17, dtype=torch.bool))
    torch.testing.assert_close((out.lse - out.positive).double(), want, rtol=1e-5, atol=1e-5)
    assert out.counts.tolist() == [16] * 17
    hashed = HashMask()
    index = torch.arange(17) * 3
    by_object = anchor_logsumexp(a, b, 20.0, include_positive=False, negatives_mask=hashed,
                                 anchor_index=index, candidate_index=index, block_size=5)
    by_dense = anchor_logsumexp(a, b, 20.0, include_positive=False,
                                negatives_mask=hashed.mask(index, index), block_size=5)
    torch.testing.assert_close(by_object.lse, by_dense.lse, rtol=0.0, atol=0.0)
    assert torch.equal(by_object.counts, by_dense.counts)


def test_gradcheck_tiled_float64() -> None:
    a, b = _pair(7, 3, torch.float64, seed=21)
    tau = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    mask = HashMask().mask(torch.arange(7), torch.arange(7))

    def loss(x: Tensor, y: Tensor, t: Tensor) -> Tensor:
        return info_nce(x, y, temperature=t, symmetric=True, negatives_mask=mask, block_size=3)

    def lse(x: Tensor, y: Tensor, t: Tensor) -> Tensor:
        rows = anchor_logsumexp(x, y, 1 / t, include_positive=False, block_size=2)
        cols = anchor_logsumexp(y, x, 1 / t, include_positive=False, block_size=2)
        return (rows.lse - rows.positive).sum() + 2 * (cols.lse - cols.positive).sum()

    assert torch.autograd.gradcheck(loss, (a, b, tau))
    assert torch.autograd.gradcheck(lse, (a, b, tau))


def test_block_size_none_dispatch_gives_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(30, 4, torch.float64, seed=9)
    plain = clip_loss(a, b, 12.0)  # B = 30 <= PLAIN_MAX_BATCH: the plain path
    assert "TiledLogSumExp" not in type(plain.grad_fn).__name__
    monkeypatch.setattr(tiled_module, "PLAIN_MAX_BATCH", 8)
    auto = clip_loss(a, b, 12.0)  # now B > PLAIN_MAX_BATCH: tiles
    chain, node = [], auto.grad_fn
    while node is not None and node.next_functions:
        chain.append(type(node).__name__)
        node = node.next_functions[0][0]
    assert any("TiledLogSumExp" in name for name in chain)
    torch.testing.assert_close(auto, plain, **F64, atol=0.0)
    auto_nce = info_nce(a, b, temperature=0.1, symmetric=True)
    monkeypatch.setattr(tiled_module, "PLAIN_MAX_BATCH", 2048)
    torch.testing.assert_close(auto_nce, info_nce(a, b, temperature=0.1, symmetric=True),
                               **F64, atol=0.0)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(2, 30), block=st.integers(1, 35), symmetric=st.booleans(),
       seed=st.integers(0, 10_000))
def test_tiled_result_does_not_depend_on_the_block(batch: int, block: int, symmetric: bool,
                                                   seed: int) -> None:
    a, b = _pair(batch, 3, torch.float64, seed=seed)
    whole = info_nce(a, b, temperature=0.05, symmetric=symmetric, block_size=batch)
    tiles = info_nce(a, b, temperature=0.05, symmetric=symmetric, block_size=block)
    torch.testing.assert_close(tiles, whole, **F64, atol=1e-12)


# ----------------------------------------------------------------------------- bfloat16


def _bf16_reference(a: Tensor, b: Tensor, scale: float, symmetric: bool) -> Tensor:
    """The loss the bf16 kernel computes, in float64 but for its one rounding: every product
    ``(scale * a_i) . b_j`` rounded to bfloat16, all the rest exact."""
    a_s = (a.detach().double() * scale).bfloat16().double()
    logits = (a_s @ b.detach().double().T).bfloat16().double()  # (B, B)
    target = torch.arange(a.shape[0])
    loss = F.cross_entropy(logits, target)
    return 0.5 * (loss + F.cross_entropy(logits.T, target)) if symmetric else loss


@pytest.mark.parametrize("temperature", [0.05, 0.005])
@pytest.mark.parametrize("symmetric", [False, True])
def test_bf16_products_with_float32_reductions(temperature: float, symmetric: bool) -> None:
    """bf16 embeddings: the tile products are bf16 (the result matches float64 on bf16-rounded
    products to float32 accuracy, which a float32 product would not) and everything else is
    float32; the loss is within 1e-2 of float64 on the unrounded inputs, gradients have cosine
    >= 0.999 with float64's and come back in bfloat16."""
    a64, b64 = _pair(96, 16, torch.float64, seed=7)
    a, b = (x.detach().bfloat16().requires_grad_(True) for x in (a64, b64))
    loss = info_nce(a, b, temperature=temperature, symmetric=symmetric, block_size=40)
    assert loss.dtype == torch.float32
    grad_a, grad_b = torch.autograd.grad(loss, (a, b))
    assert grad_a.dtype == grad_b.dtype == torch.bfloat16
    rounded = _bf16_reference(a, b, 1 / temperature, symmetric)
    assert float(loss.detach()) == pytest.approx(float(rounded), rel=1e-4)
    upcast = info_nce(a.detach().double(), b.detach().double(), temperature=temperature,
                      symmetric=symmetric)
    assert abs(float(upcast) - float(rounded)) > 10 * abs(float(loss.detach()) - float(rounded))
    exact = info_nce(a64, b64, temperature=temperature, symmetric=symmetric)
    assert float(loss.detach()) == pytest.approx(float(exact.detach()), rel=1e-2)
    for got, want in zip((grad_a, grad_b), torch.autograd.grad(exact, (a64, b64)), strict=True):
        assert float(F.cosine_similarity(got.double().flatten(), want.flatten(), dim=0)) >= 0.999


def test_bf16_anchor_logsumexp_with_masks_extra_and_learnable_scale() -> None:
    a64, b64 = _pair(40, 8, torch.float64, seed=3)
    hard64 = F.normalize(torch.randn(40, 3, 8, generator=torch.Generator().manual_seed(1),
                                     dtype=torch.float64), dim=2).requires_grad_(True)
    mask = HashMask().mask(torch.arange(40), torch.arange(40))
    scale64 = torch.tensor(20.0, dtype=torch.float64, requires_grad=True)

    def loss(a: Tensor, b: Tensor, hard: Tensor, scale: Tensor, block: int | None) -> Tensor:
        out = anchor_logsumexp(a[10:30], b, scale, offset=10, negatives_mask=mask[10:30],
                               extra=hard[10:30], block_size=block)
        return (out.lse - out.positive).mean()

    exact = loss(a64, b64, hard64, scale64, None)
    want = torch.autograd.grad(exact, (a64, b64, hard64, scale64))
    for block in (None, 7):
        inputs = [x.detach().bfloat16().requires_grad_(True) for x in (a64, b64, hard64)]
        scale = scale64.detach().float().requires_grad_(True)
        value = loss(*inputs, scale, block)
        assert value.dtype == torch.float32
        got = torch.autograd.grad(value, (*inputs, scale))
        assert [g.dtype for g in got] == [torch.bfloat16] * 3 + [torch.float32]
        assert float(value.detach()) == pytest.approx(float(exact.detach()), rel=1e-2)
        for g, w in zip(got, want, strict=True):
            assert float(F.cosine_similarity(g.double().flatten(), w.flatten(), dim=0)) >= 0.999


@pytest.mark.parametrize("temperature", [0.05, 0.005])
def test_bf16_backward_routes_agree_with_each_other_and_the_rounded_reference(
        temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrow backward's two routes (factored tiles; ``G`` formed), forced either way,
    give the same gradients up to bf16 rounding, each within cosine 0.999 of the float64
    gradient on the same bf16-rounded embeddings."""
    a64, b64 = _pair(96, 16, torch.float64, seed=11)
    grads = {}
    for factored in (True, False):
        monkeypatch.setattr(kernel_module, "FACTORED_BACKWARD", factored)
        a, b = (x.detach().bfloat16().requires_grad_(True) for x in (a64, b64))
        loss = clip_loss(a, b, 1 / temperature, block_size=40)
        grads[factored] = [g.double() for g in torch.autograd.grad(loss, (a, b))]
    ar, br = (x.detach().bfloat16().double().requires_grad_(True) for x in (a64, b64))
    want = torch.autograd.grad(clip_loss(ar, br, 1 / temperature, block_size="plain"), (ar, br))
    for got_f, got_g, w in zip(grads[True], grads[False], want, strict=True):
        assert float(F.cosine_similarity(got_f.flatten(), got_g.flatten(), dim=0)) >= 0.9999
        for got in (got_f, got_g):  # the products' bf16 rounding: 0.9999 fails at tau 0.005
            assert float(F.cosine_similarity(got.flatten(), w.flatten(), dim=0)) >= 0.999


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize(("temperature", "direct_expected"), [(0.05, True), (0.3, True),
                                                               (0.005, False)])
def test_float32_direct_tiles_agree_with_the_shifted_routes_and_float64(
        symmetric: bool, temperature: float, direct_expected: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every ``|L_ij| <= 64`` and no ``exp`` argument can fall below the floor, the
    float32 backward takes direct tiles (``G = exp(L) (c_i + t_j)``); forced off
    (``DIRECT_BACKWARD = False``) it takes the shifted routines. Both give the float64
    gradients to float32 rounding, with a mask, partial tiles and a learnable temperature; at
    ``tau = 0.005`` (``|L|`` up to 200) the direct tiles are never used."""
    a64, b64 = _pair(53, 12, torch.float64, seed=8)
    mask = HashMask().mask(torch.arange(53), torch.arange(53))

    def loss(x: Tensor, y: Tensor, t: Tensor, block: int | str) -> Tensor:
        return info_nce(x, y, temperature=t, symmetric=symmetric, negatives_mask=mask,
                        block_size=block)

    tau64 = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    want = _losses_and_grads(lambda x, y, t: loss(x, y, t, "plain"), a64, b64, tau64)
    calls: list[int] = []
    original = TileGradient._direct

    def counted(self: TileGradient, *args: object) -> Tensor:
        calls.append(1)
        return original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(TileGradient, "_direct", counted)
    grads = {}
    for direct in (True, False):
        monkeypatch.setattr(kernel_module, "DIRECT_BACKWARD", direct)
        calls.clear()
        a, b = (x.detach().float().requires_grad_(True) for x in (a64, b64))
        tau = torch.tensor(temperature, requires_grad=True)
        got = _losses_and_grads(lambda x, y, t: loss(x, y, t, 16), a, b, tau)
        assert bool(calls) == (direct and direct_expected)
        for g, w in zip(got, want, strict=True):
            _assert_same(g.double(), w, 2e-5)
        grads[direct] = got
    for g_direct, g_shifted in zip(grads[True], grads[False], strict=True):
        _assert_same(g_direct.double(), g_shifted.double(), 2e-5)


@pytest.mark.parametrize("used", ["rows", "cols", "both"])
def test_direct_tiles_for_either_direction_alone(used: str) -> None:
    """The kernel's row and column log-sum-exps, differentiated through one direction or both
    (weights ``c`` only, ``t`` only, or both), equal the dense float64 formula's gradients."""
    a64, b64 = _pair(45, 10, torch.float64, seed=4)
    scale = torch.tensor(1 / 0.07, dtype=torch.float64)
    logits = scale * a64 @ b64.T
    rows, cols = torch.logsumexp(logits, dim=1), torch.logsumexp(logits, dim=0)
    weights = torch.linspace(0.5, 1.5, 45, dtype=torch.float64)
    pick = {"rows": (1.0, 0.0), "cols": (0.0, 1.0), "both": (1.0, 1.0)}[used]
    want = torch.autograd.grad(pick[0] * (weights * rows).sum() + pick[1] * (weights * cols).sum(),
                               (a64, b64))
    a, b = (x.detach().float().requires_grad_(True) for x in (a64, b64))
    tiles = TileNegatives(None, None, None, None, include_positive=True, offset=0)
    out = kernel_module.tiled_logsumexp(a, b, scale.float(), 16, tiles, want_cols=True)
    w32 = weights.float()
    total = sum(((w32 * lse).sum() for lse, on in zip((out.lse_rows, out.lse_cols), pick,
                                                          strict=True) if on),
                torch.zeros(()))
    got = torch.autograd.grad(total, (a, b))
    for g, w in zip(got, want, strict=True):
        _assert_same(g.double(), w, 2e-5)


def test_direct_weights_are_refused_where_they_lose_precision() -> None:
    """``c = g exp(-lse)``: 0 for a line with no candidate (lse = -inf); None (the shifted
    routines) when a weight is not finite or a nonzero gradient gives a weight below float32's
    smallest normal number."""
    lse = torch.tensor([0.5, -math.inf, 3.0])
    grad = torch.tensor([1.0, 2.0, 0.0])
    weights = direct_weights(lse, lse, (grad, None))
    assert weights is not None and weights[1] is None
    torch.testing.assert_close(weights[0], torch.tensor([math.exp(-0.5), 0.0, 0.0]))
    assert direct_weights(lse, lse, (None, None)) is None
    assert direct_weights(lse, lse, (torch.tensor([1e-39, 1.0, 1.0]), None)) is None
    assert direct_weights(lse, lse, (torch.tensor([math.inf, 1.0, 1.0]), None)) is None
    assert direct_weights(torch.tensor([90.0, 0.0, 0.0]), lse, (grad, None)) is None


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("temperature", [0.3, 0.005])
@pytest.mark.parametrize("mask_kind", ["none", "dense"])
def test_side_by_side_streams_equal_one_stream_and_float64(
        workers: int, temperature: float, mask_kind: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Row blocks split over streams on their own threads (``TILE_WORKERS``) give the loss and
    every gradient of one stream and of float64 to float32 rounding (a symmetric loss, so both
    the shared rows and each stream's own columns are merged; partial tiles; a dense mask;
    the direct and the shifted routes), and leave torch's thread count as it was."""
    a64, b64 = _pair(53, 12, torch.float64, seed=9)
    mask = None if mask_kind == "none" else HashMask().mask(torch.arange(53), torch.arange(53))

    def loss(x: Tensor, y: Tensor, t: Tensor, block: int | str) -> Tensor:
        return info_nce(x, y, temperature=t, symmetric=True, negatives_mask=mask,
                        block_size=block)

    tau64 = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    want = _losses_and_grads(lambda x, y, t: loss(x, y, t, "plain"), a64, b64, tau64)
    threads = torch.get_num_threads()
    got = {}
    for count in (1, workers):
        monkeypatch.setattr(kernel_module, "TILE_WORKERS", count)
        a, b = (x.detach().float().requires_grad_(True) for x in (a64, b64))
        tau = torch.tensor(temperature, requires_grad=True)
        got[count] = _losses_and_grads(lambda x, y, t: loss(x, y, t, 16), a, b, tau)
        assert torch.get_num_threads() == threads
    for g_many, g_one, w in zip(got[workers], got[1], want, strict=True):
        _assert_same(g_many.double(), w, 2e-5)
        _assert_same(g_many.double(), g_one.double(), 2e-5)


def test_stream_count_and_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default: one stream per intra-op thread for CPU tiles of any dtype with no
    TileMask, one otherwise, never more than the row blocks, each stream on one thread; an
    error in any stream reaches the caller with torch's thread count restored."""
    cpu = torch.device("cpu")
    plain = TileNegatives(None, None, None, None, include_positive=True, offset=0)
    masked = TileNegatives(None, HashMask(), torch.arange(4), torch.arange(4),
                           include_positive=True, offset=0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert kernel_module.tile_workers(cpu, plain, 16) == 4
    assert kernel_module.tile_workers(cpu, plain, 3) == 3
    assert kernel_module.tile_workers(torch.device("meta"), plain, 16) == 1
    assert kernel_module.tile_workers(cpu, masked, 16) == 1
    monkeypatch.setattr(kernel_module, "TILE_WORKERS", 2)
    assert kernel_module.tile_workers(cpu, masked, 16) == 2
    monkeypatch.undo()
    threads = torch.get_num_threads()

    def stream(k: int, workers: int) -> int:
        assert workers == 3 and not torch.is_grad_enabled()
        if k == 2:
            raise RuntimeError("stream 2 failed")
        return k

    with pytest.raises(RuntimeError, match="stream 2 failed"):
        kernel_module.run_streams(3, stream, "cpu")
    assert torch.get_num_threads() == threads
    assert kernel_module.run_streams(2, lambda k, n: (k, n), "cpu") == [(0, 2), (1, 2)]


def test_the_backward_route_is_probed_once_and_can_be_pinned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``FACTORED_BACKWARD`` pins the route; unset, small tiles and non-CPU devices take the
    factored one, larger CPU tiles the faster of the two on one timed tile, cached."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(kernel_module, "FACTORED_BACKWARD", False)
    assert kernel_module.factored_backward(cpu, torch.bfloat16, 1024, 256) is False
    monkeypatch.setattr(kernel_module, "FACTORED_BACKWARD", None)
    assert kernel_module.factored_backward(cpu, torch.bfloat16, 8, 16) is True
    assert kernel_module.factored_backward(torch.device("meta"), torch.bfloat16, 512, 16) is True
    monkeypatch.setattr(kernel_module, "PROBE_MIN_BLOCK", 32)
    before = kernel_module._probe.cache_info()
    chosen = kernel_module.factored_backward(cpu, torch.bfloat16, 48, 24)
    assert isinstance(chosen, bool)
    assert kernel_module.factored_backward(cpu, torch.bfloat16, 48, 24) is chosen
    after = kernel_module._probe.cache_info()
    assert after.hits >= before.hits + 1 and after.currsize >= 1
    # with several streams the probe runs on one thread (a stream's), cached apart, and
    # leaves torch's count as it was
    threads = torch.get_num_threads()
    seen: list[int] = []
    real = kernel_module._time_routes
    monkeypatch.setattr(kernel_module, "_time_routes",
                        lambda *args: seen.append(torch.get_num_threads()) or real(*args))
    assert isinstance(kernel_module.factored_backward(cpu, torch.bfloat16, 40, 24, workers=2),
                      bool)
    assert seen == [1] and torch.get_num_threads() == threads


@pytest.mark.parametrize("factored", [True, False])
def test_bf16_streams_equal_one_stream(factored: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 tiles split over two streams (the CPU default) give one stream's loss and
    gradients to bf16 rounding on either backward route, both close to float64's."""
    a64, b64 = _pair(70, 16, torch.float64, seed=4)
    scale64 = torch.tensor(12.0, dtype=torch.float64, requires_grad=True)
    want = _losses_and_grads(lambda x, y, s: clip_loss(x, y, s, block_size="plain"),
                             a64, b64, scale64)
    monkeypatch.setattr(kernel_module, "FACTORED_BACKWARD", factored)
    got = {}
    for count in (1, 2):
        monkeypatch.setattr(kernel_module, "TILE_WORKERS", count)
        a, b = (x.detach().bfloat16().requires_grad_(True) for x in (a64, b64))
        scale = torch.tensor(12.0, requires_grad=True)
        got[count] = _losses_and_grads(lambda x, y, s: clip_loss(x, y, s, block_size=16),
                                       a, b, scale)
    for two, one, exact in zip(got[2], got[1], want, strict=True):
        _assert_same(two.double(), one.double(), 1e-2)
        _assert_same(two.double(), exact, 3e-2)


def test_bf16_under_autocast_keeps_float32_reductions() -> None:
    """float32 embeddings under bf16 autocast: the plain and tiled paths agree, in float32."""
    a, b = _pair(50, 8, torch.float32, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = anchor_logsumexp(a, b, 50.0)
        tiled = anchor_logsumexp(a, b, 50.0, block_size=16)
    assert plain.lse.dtype == tiled.lse.dtype == torch.float32
    torch.testing.assert_close(tiled.lse, plain.lse, rtol=1e-2, atol=0.0)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [0, -3])
def test_bad_block_size_values(bad: int) -> None:
    a, b = _pair(6, 2, torch.float32, seed=0)
    for call in (lambda: info_nce(a, b, block_size=bad),
                 lambda: clip_loss(a, b, 2.0, block_size=bad),
                 lambda: anchor_logsumexp(a, b, 2.0, block_size=bad)):
        with pytest.raises(CrlValueError, match=rf"block_size.*>= 1.*got {bad}"):
            call()


@pytest.mark.parametrize("bad", [2.5, True, "4", 4.0])
def test_bad_block_size_types(bad: object) -> None:
    a, b = _pair(6, 2, torch.float32, seed=0)
    with pytest.raises(CrlTypeError, match=r"block_size.*integer"):
        info_nce(a, b, block_size=bad)  # type: ignore[arg-type]
    with pytest.raises(CrlTypeError, match=r"block_size.*integer"):
        clip_loss(a, b, 1.0, block_size=bad)  # type: ignore[arg-type]


def test_bad_masks_and_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(6, 2, torch.float32, seed=0)
    with pytest.raises(CrlTypeError, match=r"negatives_mask.*TileMask"):
        info_nce(a, b, negatives_mask=[[True]], block_size=4)  # type: ignore[arg-type]
    with pytest.raises(CrlValueError, match=r"negatives_mask.*shape \(6, 6\)"):
        info_nce(a, b, negatives_mask=torch.ones(5, 5, dtype=torch.bool), block_size=4)

    class WrongShape:
        def mask(self, rows_index: Tensor, cols_index: Tensor, /) -> Tensor:
            return torch.ones(rows_index.numel(), cols_index.numel() + 1, dtype=torch.bool)

    with pytest.raises(CrlValueError, match=r"TileMask.mask.*shape \(6, 6\)"):
        info_nce(a, b, negatives_mask=WrongShape(), block_size=4)  # the block, made dense
    with monkeypatch.context() as patch:
        patch.setattr(tiled_module, "DENSE_MASK_MAX_ENTRIES", 0)
        with pytest.raises(CrlValueError, match=r"TileMask.mask.*shape \(4, 4\)"):
            info_nce(a, b, negatives_mask=WrongShape(), block_size=4)  # one tile

    class NoNegatives:
        def mask(self, rows_index: Tensor, cols_index: Tensor, /) -> Tensor:
            out = torch.ones(rows_index.numel(), cols_index.numel(), dtype=torch.bool)
            out[rows_index == 2] = False
            return out

    with pytest.raises(CrlValueError, match=r"at least one negative.*first: \[2\]"):
        info_nce(a, b, negatives_mask=NoNegatives(), block_size=4)
    with pytest.raises(CrlValueError, match=r"`index` must have shape \(6,\)"):
        info_nce(a, b, negatives_mask=HashMask(), index=torch.arange(5), block_size=4)
    with pytest.raises(CrlTypeError, match="`index` must have an integer dtype"):
        info_nce(a, b, negatives_mask=HashMask(), index=torch.zeros(6))
    with pytest.raises(CrlValueError, match=r"scale.*positive"):
        clip_loss(a, b, -1.0, block_size=4)
    with pytest.raises(CrlValueError, match=r"1-D `scale` must have shape \(6,\)"):
        anchor_logsumexp(a, b, torch.ones(5))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 12), cols=st.integers(1, 12), spread=st.sampled_from([1.0, 50.0, 400.0]),
       excluded=st.floats(0.0, 0.9), double=st.booleans(), seed=st.integers(0, 10_000))
def test_tile_logsumexps_equal_torch_logsumexp(rows: int, cols: int, spread: float,
                                               excluded: float, double: bool, seed: int) -> None:
    """The one-exp row/column log-sum-exps of one tile (no public call exposes a single tile),
    on logits spread far beyond the exp range and with excluded (-inf) entries, equal
    torch.logsumexp (columns via the fallback too)."""
    dtype = torch.float64 if double else torch.float32
    gen = torch.Generator().manual_seed(seed)
    x = (spread * torch.randn(rows, cols, generator=gen, dtype=torch.float64)).to(dtype)
    x[torch.rand(rows, cols, generator=gen) < excluded] = -math.inf
    got_rows, got_cols = tile_logsumexps(x, torch.empty_like(x), True)
    assert got_cols is not None
    tol = {"rtol": 1e-12, "atol": 1e-12} if double else {"rtol": 1e-6, "atol": 1e-5}
    torch.testing.assert_close(got_rows, torch.logsumexp(x, dim=1), **tol)
    torch.testing.assert_close(got_cols, torch.logsumexp(x, dim=0), **tol)
