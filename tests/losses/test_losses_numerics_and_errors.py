"""Numerical robustness (tiny temperatures, logits up to 1e4 in float32, half-precision inputs),
input validation (error class and message) and the loss modules of crl.losses."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from loss_reference import (
    ref_clip_loss,
    ref_contrastive_risk,
    ref_info_nce,
    ref_oce_cvar,
    ref_oce_kl,
    ref_oce_softplus,
    ref_pairwise_risk,
    ref_relaxed_kmeans,
    ref_siglip_loss,
    ref_supcon_loss,
)
from torch import Tensor

from crl.errors import CrlTypeError, CrlValueError
from crl.losses import (
    ClipLoss,
    InfoNCELoss,
    SigLipLoss,
    SupConLoss,
    clip_loss,
    contrastive_risk,
    info_nce,
    oce_risk,
    pairwise_risk,
    relaxed_kmeans,
    siglip_loss,
    supcon_loss,
)

LossFn = Callable[..., Tensor]


def _gaussian(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _sphere(batch: int, dim: int, seed: int, radius: float) -> Tensor:
    """``(B, D)`` float32 rows of norm ``radius``."""
    x = _gaussian(batch, dim, seed=seed, dtype=torch.float64)
    return (radius * F.normalize(x, dim=1)).float()


def _uniform(rows: int, cols: int, seed: int, bound: float) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (bound * (2 * torch.rand(rows, cols, generator=gen, dtype=torch.float64) - 1)).float()


MASK = torch.tensor([[False, True, False, True, False, False],
                     [True, True, False, False, False, True],
                     [True, True, True, True, True, True],
                     [False, False, True, False, False, False],
                     [True, False, True, True, False, True],
                     [False, True, False, False, True, False]])
LABELS = torch.tensor([0, 1, 2, 0, 1, 3])


# --- extreme temperatures and logits in float32 -------------------------------------------
# Each case: (ours, reference, inputs, largest |logit|). Radius sqrt(50) with tau = 0.005, or
# radius 10 with scale 100, puts the logits at up to 1e4.

R_TAU = math.sqrt(50.0)


def _embedding_cases() -> list[tuple[str, LossFn, LossFn, list[Tensor], float]]:
    a, b = _sphere(6, 8, seed=0, radius=R_TAU), _sphere(6, 8, seed=1, radius=R_TAU)
    unit_a, unit_b = _sphere(6, 8, seed=2, radius=1.0), _sphere(6, 8, seed=3, radius=1.0)
    big_a, big_b = _sphere(6, 8, seed=4, radius=10.0), _sphere(6, 8, seed=5, radius=10.0)
    tau = 0.005
    return [
        ("info_nce_unit_tau_0.005", lambda x, y: info_nce(x, y, temperature=tau),
         lambda x, y: ref_info_nce(x, y, tau), [unit_a, unit_b], 1 / tau),
        ("info_nce_logits_1e4", lambda x, y: info_nce(x, y, temperature=tau),
         lambda x, y: ref_info_nce(x, y, tau), [a, b], 1e4),
        ("info_nce_symmetric_masked_logits_1e4",
         lambda x, y: info_nce(x, y, temperature=tau, symmetric=True, negatives_mask=MASK),
         lambda x, y: ref_info_nce(x, y, tau, symmetric=True, negatives_mask=MASK), [a, b], 1e4),
        ("contrastive_risk_masked_logits_1e4",
         lambda x, y: contrastive_risk(x, y, temperature=tau, negatives_mask=MASK),
         lambda x, y: ref_contrastive_risk(x, y, tau, negatives_mask=MASK), [a, b], 1e4),
        ("clip_loss_scale_100_logits_1e4", lambda x, y: clip_loss(x, y, 100.0),
         lambda x, y: ref_clip_loss(x, y, 100.0), [big_a, big_b], 1e4),
        ("siglip_loss_scale_100_logits_1e4", lambda x, y: siglip_loss(x, y, 100.0, -10.0),
         lambda x, y: ref_siglip_loss(x, y, 100.0, -10.0), [big_a, big_b], 1e4),
        ("supcon_logits_1e4", lambda z: supcon_loss(z, LABELS, temperature=tau),
         lambda z: ref_supcon_loss(z, LABELS, tau), [a], 1e4),
    ]


def _delta_cases() -> list[tuple[str, LossFn, LossFn, list[Tensor], float]]:
    tau = 0.005
    small = _uniform(4, 9, seed=6, bound=50.0)  # delta / tau up to 1e4
    big = _uniform(4, 9, seed=7, bound=1e4)
    cases: list[tuple[str, LossFn, LossFn, list[Tensor], float]] = [
        ("oce_kl_tau_0.005", lambda d: oce_risk(d, phi="kl", temperature=tau),
         lambda d: ref_oce_kl(d, tau), [small], 1e4),
        ("oce_cvar_delta_1e4", lambda d: oce_risk(d, phi="cvar", alpha=0.3),
         lambda d: ref_oce_cvar(d, 0.3), [big], 1e4),
        ("oce_softplus_delta_1e4", lambda d: oce_risk(d, phi="softplus"),
         ref_oce_softplus, [big], 1e4),
    ]
    for loss in ("logistic", "squared_hinge", "hinge"):
        cases.append((f"pairwise_{loss}_delta_1e4",
                      lambda d, loss=loss: pairwise_risk(d, loss=loss),
                      lambda d, loss=loss: ref_pairwise_risk(d, loss), [big], 1e4))
    cases.append(("pairwise_exponential_delta_50",
                  lambda d: pairwise_risk(d, loss="exponential"),
                  lambda d: ref_pairwise_risk(d, "exponential"), [_uniform(4, 9, 8, 50.0)], 50.0))
    return cases


EXTREME_CASES = _embedding_cases() + _delta_cases()


@pytest.mark.parametrize(("name", "ours", "ref", "inputs", "bound"), EXTREME_CASES,
                         ids=[case[0] for case in EXTREME_CASES])
def test_float32_extreme_logits_are_finite_and_match_float64(
        name: str, ours: LossFn, ref: LossFn, inputs: list[Tensor], bound: float) -> None:
    leaves32 = [x.clone().requires_grad_(True) for x in inputs]
    value = ours(*leaves32)
    number = float(value.detach())
    assert value.dtype == torch.float32
    assert bool(torch.isfinite(value))
    grads32 = torch.autograd.grad(value, leaves32)
    assert all(bool(torch.isfinite(g).all()) for g in grads32)

    leaves64 = [x.detach().double().requires_grad_(True) for x in inputs]
    expected = ref(*leaves64)
    grads64 = torch.autograd.grad(expected, leaves64)
    # float32 rounding of a logit of size L is about 1e-7 L; the loss is Lipschitz in the logits.
    atol = 1e-6 * bound + 1e-6
    reference = float(expected.detach())
    assert abs(number - reference) <= atol + 1e-5 * abs(reference), name
    for g32, g64 in zip(grads32, grads64, strict=True):
        torch.testing.assert_close(g32.double(), g64, rtol=1e-3,
                                   atol=1e-3 * float(g64.abs().max()) + 1e-6)


def test_relaxed_kmeans_float32_large_entries_matches_float64() -> None:
    z = 100.0 * _gaussian(12, 5, seed=9)
    for k in range(1, 6):
        value = relaxed_kmeans(z, k)
        assert value.dtype == torch.float32
        expected = ref_relaxed_kmeans(z.double(), k)
        largest = ref_relaxed_kmeans(z.double(), 0)  # the trace: every eigenvalue
        assert abs(float(value) - expected) <= 1e-5 * largest


# --- half-precision inputs compute in float32 ---------------------------------------------


def _half_cases() -> list[tuple[str, LossFn, LossFn, list[Tensor]]]:
    a, b = _sphere(5, 6, seed=10, radius=1.0), _sphere(5, 6, seed=11, radius=1.0)
    z = _sphere(6, 6, seed=12, radius=1.0)
    d = _uniform(3, 5, seed=13, bound=2.0)
    return [
        ("info_nce", lambda x, y: info_nce(x, y, temperature=0.1, symmetric=True),
         lambda x, y: ref_info_nce(x, y, 0.1, symmetric=True), [a, b]),
        ("clip_loss", lambda x, y: clip_loss(x, y, 1 / 0.07),
         lambda x, y: ref_clip_loss(x, y, 1 / 0.07), [a, b]),
        ("siglip_loss", lambda x, y: siglip_loss(x, y, 10.0, -10.0),
         lambda x, y: ref_siglip_loss(x, y, 10.0, -10.0), [a, b]),
        ("contrastive_risk", lambda x, y: contrastive_risk(x, y, temperature=0.1),
         lambda x, y: ref_contrastive_risk(x, y, 0.1), [a, b]),
        ("supcon_loss", lambda x: supcon_loss(x, LABELS), lambda x: ref_supcon_loss(x, LABELS, 0.1),
         [z]),
        ("oce_kl", lambda x: oce_risk(x, phi="kl", temperature=0.2),
         lambda x: ref_oce_kl(x, 0.2), [d]),
        ("oce_cvar", lambda x: oce_risk(x, phi="cvar", alpha=0.5),
         lambda x: ref_oce_cvar(x, 0.5), [d]),
        ("oce_softplus", lambda x: oce_risk(x, phi="softplus"), ref_oce_softplus, [d]),
        ("pairwise_logistic", lambda x: pairwise_risk(x),
         lambda x: ref_pairwise_risk(x, "logistic"), [d]),
        ("relaxed_kmeans", lambda x: relaxed_kmeans(x, 2),
         lambda x: torch.tensor(ref_relaxed_kmeans(x, 2), dtype=torch.float64), [z]),
    ]


HALF_CASES = _half_cases()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("name", "ours", "ref", "inputs"), HALF_CASES,
                         ids=[case[0] for case in HALF_CASES])
def test_half_precision_inputs_compute_in_float32(dtype: torch.dtype, name: str, ours: LossFn,
                                                  ref: LossFn, inputs: list[Tensor]) -> None:
    halves = [x.to(dtype).requires_grad_(True) for x in inputs]
    value = ours(*halves)
    assert value.dtype == torch.float32, name
    # Against float64 on the very same (rounded) half values: only float32 rounding remains,
    # far below half precision's ~1e-3.
    expected = ref(*[x.detach().double() for x in halves])
    assert float(value.detach()) == pytest.approx(float(expected), rel=2e-6, abs=2e-6), name
    if name != "relaxed_kmeans":  # eigvalsh backward in float32 is tested in parity/gradcheck
        grads = torch.autograd.grad(value, halves)
        assert all(g.dtype == dtype and bool(torch.isfinite(g).all()) for g in grads)


# --- bad input ----------------------------------------------------------------------------

A = _gaussian(4, 3, seed=20)
B = _gaussian(4, 3, seed=21)
D = _gaussian(3, 5, seed=22)
NAN_A = A.clone()
NAN_A[1, 2] = float("nan")
INF_B = B.clone()
INF_B[0, 0] = float("inf")
NO_NEGATIVE_ROW = ~torch.eye(4, dtype=torch.bool)
NO_NEGATIVE_ROW[2] = False
NO_NEGATIVE_ROW[2, 2] = True  # only the positive: row 2 has no negative
EMPTY_VALID_ROW = torch.ones(3, 5, dtype=torch.bool)
EMPTY_VALID_ROW[1] = False

# (id, call, error class, substrings the message must contain)
BAD_INPUTS: list[tuple[str, Callable[[], Any], type[Exception], list[str]]] = [
    # info_nce
    ("info_nce-a-rank", lambda: info_nce(A[0], B), CrlValueError,
     ["info_nce", "`a`", "2-D", "(3,)"]),
    ("info_nce-b-rank", lambda: info_nce(A, B[None]), CrlValueError, ["`b`", "2-D", "(1, 4, 3)"]),
    ("info_nce-a-type", lambda: info_nce(A.tolist(), B), CrlTypeError, ["`a`", "torch.Tensor"]),
    ("info_nce-a-int", lambda: info_nce(A.long(), B), CrlTypeError, ["`a`", "floating", "int64"]),
    ("info_nce-shapes", lambda: info_nce(A, B[:, :2]), CrlValueError,
     ["`a`", "`b`", "same shape", "(4, 3)", "(4, 2)"]),
    ("info_nce-batch-rows", lambda: info_nce(A, B[:3]), CrlValueError, ["(4, 3)", "(3, 3)"]),
    ("info_nce-B<2", lambda: info_nce(A[:1], B[:1]), CrlValueError, ["B >= 2", "B = 1"]),
    ("info_nce-nan", lambda: info_nce(NAN_A, B), CrlValueError, ["`a`", "finite", "NaN"]),
    ("info_nce-inf", lambda: info_nce(A, INF_B), CrlValueError, ["`b`", "finite", "Inf"]),
    ("info_nce-tau-0", lambda: info_nce(A, B, temperature=0.0), CrlValueError,
     ["`temperature`", "positive", "0.0"]),
    ("info_nce-tau-neg", lambda: info_nce(A, B, temperature=-0.1), CrlValueError,
     ["`temperature`", "positive", "-0.1"]),
    ("info_nce-tau-nan", lambda: info_nce(A, B, temperature=float("nan")), CrlValueError,
     ["`temperature`", "finite", "nan"]),
    ("info_nce-tau-inf", lambda: info_nce(A, B, temperature=float("inf")), CrlValueError,
     ["`temperature`", "finite", "inf"]),
    ("info_nce-tau-tensor-0", lambda: info_nce(A, B, temperature=torch.tensor(0.0)),
     CrlValueError, ["`temperature`", "positive"]),
    ("info_nce-tau-vector", lambda: info_nce(A, B, temperature=torch.ones(2)), CrlValueError,
     ["`temperature`", "scalar", "(2,)"]),
    ("info_nce-tau-str", lambda: info_nce(A, B, temperature="0.1"), CrlTypeError,
     ["`temperature`", "number", "'0.1'"]),
    ("info_nce-tau-bool", lambda: info_nce(A, B, temperature=True), CrlTypeError,
     ["`temperature`", "True"]),
    ("info_nce-mask-shape", lambda: info_nce(A, B, negatives_mask=torch.ones(3, 3).bool()),
     CrlValueError, ["`negatives_mask`", "(4, 4)", "(3, 3)"]),
    ("info_nce-mask-dtype", lambda: info_nce(A, B, negatives_mask=torch.ones(4, 4)),
     CrlTypeError, ["`negatives_mask`", "torch.bool", "float32"]),
    ("info_nce-mask-no-negative", lambda: info_nce(A, B, negatives_mask=NO_NEGATIVE_ROW),
     CrlValueError, ["`negatives_mask`", "negative", "[2]"]),
    ("info_nce-symmetric-mask-no-negative",
     lambda: info_nce(A, B, symmetric=True, negatives_mask=NO_NEGATIVE_ROW),
     CrlValueError, ["`negatives_mask`", "[2]"]),
    # clip_loss
    ("clip-scale-0", lambda: clip_loss(A, B, 0.0), CrlValueError, ["clip_loss", "`scale`", "0.0"]),
    ("clip-scale-neg", lambda: clip_loss(A, B, torch.tensor(-2.0)), CrlValueError,
     ["`scale`", "-2.0"]),
    ("clip-scale-inf", lambda: clip_loss(A, B, float("inf")), CrlValueError, ["`scale`", "inf"]),
    ("clip-scale-nan", lambda: clip_loss(A, B, float("nan")), CrlValueError, ["`scale`", "nan"]),
    ("clip-shapes", lambda: clip_loss(A, B.T, 1.0), CrlValueError, ["same shape", "(3, 4)"]),
    ("clip-B<2", lambda: clip_loss(A[:1], B[:1], 1.0), CrlValueError, ["B = 1"]),
    ("clip-nan", lambda: clip_loss(NAN_A, B, 1.0), CrlValueError, ["`a`", "NaN"]),
    # siglip_loss
    ("siglip-scale-0", lambda: siglip_loss(A, B, 0.0, 0.0), CrlValueError,
     ["siglip_loss", "`scale`", "0.0"]),
    ("siglip-scale-nan", lambda: siglip_loss(A, B, float("nan"), 0.0), CrlValueError,
     ["`scale`", "nan"]),
    ("siglip-bias-inf", lambda: siglip_loss(A, B, 1.0, float("-inf")), CrlValueError,
     ["`bias`", "finite", "-inf"]),
    ("siglip-bias-nan-tensor", lambda: siglip_loss(A, B, 1.0, torch.tensor(float("nan"))),
     CrlValueError, ["`bias`", "nan"]),
    ("siglip-bias-str", lambda: siglip_loss(A, B, 1.0, "x"), CrlTypeError, ["`bias`", "'x'"]),
    ("siglip-rank", lambda: siglip_loss(A[None], B[None], 1.0, 0.0), CrlValueError,
     ["`a`", "2-D"]),
    ("siglip-B<2", lambda: siglip_loss(A[:1], B[:1], 1.0, 0.0), CrlValueError, ["B = 1"]),
    ("siglip-inf", lambda: siglip_loss(A, INF_B, 1.0, 0.0), CrlValueError, ["`b`", "Inf"]),
    # supcon_loss
    ("supcon-z-rank", lambda: supcon_loss(A[0], LABELS[:3]), CrlValueError,
     ["supcon_loss", "`z`", "2-D"]),
    ("supcon-labels-shape", lambda: supcon_loss(A, LABELS), CrlValueError,
     ["`labels`", "(4,)", "(6,)"]),
    ("supcon-labels-float", lambda: supcon_loss(A, torch.zeros(4)), CrlTypeError,
     ["`labels`", "integers", "float32"]),
    ("supcon-labels-list", lambda: supcon_loss(A, [0, 0, 1, 1]), CrlTypeError,
     ["`labels`", "torch.Tensor"]),
    ("supcon-N<2", lambda: supcon_loss(A[:1], LABELS[:1]), CrlValueError, ["at least 2", "1"]),
    ("supcon-no-positive", lambda: supcon_loss(A, torch.arange(4)), CrlValueError,
     ["no anchor", "label"]),
    ("supcon-nan", lambda: supcon_loss(NAN_A, torch.zeros(4, dtype=torch.long)), CrlValueError,
     ["`z`", "NaN"]),
    ("supcon-tau-0", lambda: supcon_loss(A, torch.zeros(4, dtype=torch.long), temperature=0),
     CrlValueError, ["`temperature`", "0"]),
    # contrastive_risk
    ("risk-tau-neg", lambda: contrastive_risk(A, B, temperature=-1.0), CrlValueError,
     ["contrastive_risk", "`temperature`", "-1.0"]),
    ("risk-mask-no-negative",
     lambda: contrastive_risk(A, B, temperature=0.1, negatives_mask=NO_NEGATIVE_ROW),
     CrlValueError, ["`negatives_mask`", "[2]"]),
    ("risk-mask-shape",
     lambda: contrastive_risk(A, B, temperature=0.1, negatives_mask=torch.ones(4, 5).bool()),
     CrlValueError, ["`negatives_mask`", "(4, 4)", "(4, 5)"]),
    ("risk-B<2", lambda: contrastive_risk(A[:1], B[:1], temperature=0.1), CrlValueError,
     ["B = 1"]),
    ("risk-shapes", lambda: contrastive_risk(A, D, temperature=0.1), CrlValueError,
     ["same shape"]),
    # oce_risk
    ("oce-phi", lambda: oce_risk(D, phi="entropic", temperature=1.0), CrlValueError,
     ["oce_risk", "phi", "'entropic'", "'kl'", "'cvar'", "'softplus'"]),
    ("oce-rank", lambda: oce_risk(D[0], temperature=1.0), CrlValueError,
     ["`delta`", "2-D", "(5,)"]),
    ("oce-empty", lambda: oce_risk(D[:, :0], phi="softplus"), CrlValueError,
     ["`delta`", "(3, 0)"]),
    ("oce-nan", lambda: oce_risk(D.masked_fill(D > 0, float("nan")), phi="softplus"),
     CrlValueError, ["`delta`", "NaN"]),
    ("oce-kl-no-tau", lambda: oce_risk(D, phi="kl"), CrlValueError, ["`temperature`", "None"]),
    ("oce-kl-tau-0", lambda: oce_risk(D, phi="kl", temperature=0.0), CrlValueError,
     ["`temperature`", "0.0"]),
    ("oce-cvar-no-alpha", lambda: oce_risk(D, phi="cvar"), CrlValueError, ["`alpha`", "None"]),
    ("oce-cvar-alpha-0", lambda: oce_risk(D, phi="cvar", alpha=0.0), CrlValueError,
     ["`alpha`", "0.0"]),
    ("oce-cvar-alpha-big", lambda: oce_risk(D, phi="cvar", alpha=1.5), CrlValueError,
     ["`alpha`", "(0, 1]", "1.5"]),
    ("oce-cvar-alpha-nan", lambda: oce_risk(D, phi="cvar", alpha=float("nan")), CrlValueError,
     ["`alpha`", "nan"]),
    ("oce-cvar-alpha-inf", lambda: oce_risk(D, phi="cvar", alpha=float("inf")), CrlValueError,
     ["`alpha`", "inf"]),
    ("oce-mask-shape", lambda: oce_risk(D, phi="softplus", mask=torch.ones(5, 3).bool()),
     CrlValueError, ["`mask`", "(3, 5)", "(5, 3)"]),
    ("oce-mask-empty-row", lambda: oce_risk(D, phi="softplus", mask=EMPTY_VALID_ROW),
     CrlValueError, ["`mask`", "[1]"]),
    # pairwise_risk
    ("pairwise-loss", lambda: pairwise_risk(D, loss="zero_one"), CrlValueError,
     ["pairwise_risk", "loss", "'zero_one'", "'logistic'", "'exponential'", "'squared_hinge'",
      "'hinge'"]),
    ("pairwise-rank", lambda: pairwise_risk(D[None]), CrlValueError, ["`delta`", "2-D"]),
    ("pairwise-inf", lambda: pairwise_risk(D.masked_fill(D > 0, float("inf"))), CrlValueError,
     ["`delta`", "Inf"]),
    ("pairwise-mask-empty-row", lambda: pairwise_risk(D, mask=EMPTY_VALID_ROW), CrlValueError,
     ["`mask`", "[1]"]),
    ("pairwise-mask-dtype", lambda: pairwise_risk(D, mask=EMPTY_VALID_ROW.int()), CrlTypeError,
     ["`mask`", "torch.bool", "int32"]),
    # relaxed_kmeans
    ("rkm-k-0", lambda: relaxed_kmeans(A, 0), CrlValueError,
     ["relaxed_kmeans", "`k`", "[1, 3]", "0"]),
    ("rkm-k-big", lambda: relaxed_kmeans(A, 4), CrlValueError, ["`k`", "[1, 3]", "4"]),
    ("rkm-k-float", lambda: relaxed_kmeans(A, 1.0), CrlTypeError, ["`k`", "integer", "1.0"]),
    ("rkm-rank", lambda: relaxed_kmeans(A[0], 1), CrlValueError, ["`z`", "2-D", "(3,)"]),
    ("rkm-nan", lambda: relaxed_kmeans(NAN_A, 1), CrlValueError, ["`z`", "NaN"]),
    # modules
    ("InfoNCELoss-tau", lambda: InfoNCELoss(temperature=0.0), CrlValueError,
     ["InfoNCELoss", "`temperature`", "0.0"]),
    ("InfoNCELoss-tau-tensor", lambda: InfoNCELoss(temperature=torch.tensor(0.1)),  # type: ignore[arg-type]
     CrlTypeError, ["`temperature`", "number"]),
    ("SupConLoss-tau", lambda: SupConLoss(temperature=-1.0), CrlValueError,
     ["SupConLoss", "`temperature`", "-1.0"]),
    ("InfoNCELoss-forward", lambda: InfoNCELoss()(A, B[:2]), CrlValueError, ["same shape"]),
    ("ClipLoss-forward", lambda: ClipLoss()(A, NAN_A), CrlValueError, ["`b`", "NaN"]),
    ("SigLipLoss-forward", lambda: SigLipLoss()(A[:1], B[:1]), CrlValueError, ["B = 1"]),
]


@pytest.mark.parametrize(("call", "error", "fragments"),
                         [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_raises_named_error(call: Callable[[], Any], error: type[Exception],
                                      fragments: list[str]) -> None:
    with pytest.raises(error) as info:
        call()
    # The crl errors are also the builtin classes callers catch.
    assert isinstance(info.value, ValueError if error is CrlValueError else TypeError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_negatives_mask_diagonal_is_ignored() -> None:
    a, b = _gaussian(6, 4, seed=30, dtype=torch.float64), _gaussian(6, 4, seed=31,
                                                                    dtype=torch.float64)
    with_diagonal = MASK | torch.eye(6, dtype=torch.bool)
    without_diagonal = MASK & ~torch.eye(6, dtype=torch.bool)
    for fn in (lambda m: info_nce(a, b, temperature=0.2, negatives_mask=m),
               lambda m: info_nce(a, b, temperature=0.2, symmetric=True, negatives_mask=m),
               lambda m: contrastive_risk(a, b, temperature=0.2, negatives_mask=m)):
        torch.testing.assert_close(fn(with_diagonal), fn(without_diagonal), rtol=0, atol=0)


# --- modules ------------------------------------------------------------------------------


def _open_clip_style_loss(image_features: Tensor, text_features: Tensor,
                          logit_scale: Tensor) -> Tensor:
    """open_clip ``ClipLoss.forward`` with world_size 1, written out."""
    logits_per_image = logit_scale * image_features @ text_features.T
    logits_per_text = logit_scale * text_features @ image_features.T
    labels = torch.arange(logits_per_image.shape[0], dtype=torch.long)
    return (F.cross_entropy(logits_per_image, labels)
            + F.cross_entropy(logits_per_text, labels)) / 2


def test_clip_loss_equals_open_clip_computation() -> None:
    image = F.normalize(_gaussian(8, 16, seed=32, dtype=torch.float64), dim=-1)
    text = F.normalize(_gaussian(8, 16, seed=33, dtype=torch.float64), dim=-1)
    for scale in (1 / 0.07, 100.0, 1.0):
        scale_t = torch.tensor(scale, dtype=torch.float64)
        torch.testing.assert_close(clip_loss(image, text, scale),
                                   _open_clip_style_loss(image, text, scale_t),
                                   rtol=1e-12, atol=1e-12)
    module = ClipLoss().double()
    torch.testing.assert_close(module(image, text),
                               _open_clip_style_loss(image, text, module.logit_scale.exp()),
                               rtol=1e-12, atol=1e-12)


def test_clip_module_init_and_gradient() -> None:
    module = ClipLoss()
    assert isinstance(module.logit_scale, torch.nn.Parameter)
    assert module.logit_scale.requires_grad
    assert float(module.logit_scale.detach()) == pytest.approx(math.log(1 / 0.07), rel=1e-6)
    a, b = _sphere(5, 4, seed=34, radius=1.0), _sphere(5, 4, seed=35, radius=1.0)
    loss = module(a, b)
    torch.testing.assert_close(loss, clip_loss(a, b, 1 / 0.07))
    loss.backward()
    assert module.logit_scale.grad is not None and bool(torch.isfinite(module.logit_scale.grad))
    assert not ClipLoss(learnable=False).logit_scale.requires_grad


def test_clip_module_clamps_logit_scale_to_log_100() -> None:
    module = ClipLoss()
    a, b = _sphere(5, 4, seed=36, radius=1.0), _sphere(5, 4, seed=37, radius=1.0)
    with torch.no_grad():
        module.logit_scale.fill_(10.0)  # exp(10) ~ 22026, far above CLIP's 100
    loss = module(a, b)
    torch.testing.assert_close(loss, clip_loss(a, b, 100.0))
    assert float(module.logit_scale.detach()) == pytest.approx(math.log(100.0), rel=1e-6)
    assert float(module.logit_scale.detach().exp()) <= 100.0 * (1 + 1e-6)
    # The documented lower clamp: logit_scale >= 0, i.e. scale >= 1.
    with torch.no_grad():
        module.logit_scale.fill_(-3.0)
    torch.testing.assert_close(module(a, b), clip_loss(a, b, 1.0))
    assert float(module.logit_scale.detach()) == 0.0
    # An initial value above the cap starts at the cap.
    capped = ClipLoss(init_logit_scale=10.0).logit_scale.detach()
    assert float(capped) == pytest.approx(math.log(100.0))


def test_siglip_module_init_forward_and_gradients() -> None:
    module = SigLipLoss()
    assert float(module.logit_scale.detach()) == pytest.approx(math.log(10.0), rel=1e-6)
    assert float(module.logit_bias.detach()) == -10.0
    assert module.logit_scale.requires_grad and module.logit_bias.requires_grad
    a, b = _sphere(5, 4, seed=38, radius=1.0), _sphere(5, 4, seed=39, radius=1.0)
    loss = module(a, b)
    torch.testing.assert_close(loss, siglip_loss(a, b, 10.0, -10.0))
    loss.backward()
    for parameter in (module.logit_scale, module.logit_bias):
        assert parameter.grad is not None and float(parameter.grad) != 0.0
    with torch.no_grad():
        module.logit_scale.fill_(10.0)
    torch.testing.assert_close(module(a, b), siglip_loss(a, b, 100.0, -10.0))


def test_infonce_and_supcon_modules_call_the_functions() -> None:
    a, b = _gaussian(6, 4, seed=40), _gaussian(6, 4, seed=41)
    module = InfoNCELoss(temperature=0.2, symmetric=True)
    torch.testing.assert_close(module(a, b, MASK),
                               info_nce(a, b, temperature=0.2, symmetric=True,
                                        negatives_mask=MASK))
    torch.testing.assert_close(InfoNCELoss()(a, b), info_nce(a, b))
    assert "temperature=0.2" in repr(module) and "symmetric=True" in repr(module)
    torch.testing.assert_close(SupConLoss(temperature=0.3)(a, LABELS),
                               supcon_loss(a, LABELS, temperature=0.3))
    torch.testing.assert_close(SupConLoss()(a, LABELS), supcon_loss(a, LABELS, temperature=0.1))
