"""GroupedGcl (crl.losses.gcl_group) against each run's own objective: the same losses,
gradients and ``u`` states, bit for bit at the study's shapes and to 1e-6 at any shape, over
several steps (so that the moving averages act), for shared, independent and in-batch
negatives, sets small enough that anchors go without a negative, both directions or one,
with and without the positive among the candidates, and per-run temperatures and gammas."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from crl.errors import CrlValueError
from crl.losses import Objective, build_objective
from crl.losses.config import LossConfig
from crl.losses.gcl_group import GroupedGcl, grouped_gcl
from crl.negatives import NegativesConfig

#: (regime, m) of the runs of a group: the quick study's kinds, and a run with no set.
RUNS = [("shared", 5), ("independent", 5), ("shared", 50), ("independent", 50), ("in_batch", None)]


def _objectives(n: int, *, symmetric: bool = True, include_positive: bool = False,
                runs: list[tuple[str, int | None]] = RUNS) -> list[Objective]:
    out = []
    for g, (regime, m) in enumerate(runs):
        loss = LossConfig(name="gcl", temperature=0.05 + 0.01 * g, symmetric=symmetric,
                          gcl={"gamma": 0.9 - 0.1 * g, "include_positive": include_positive})
        out.append(build_objective(loss, NegativesConfig(regime=regime, m=m, seed=g),
                                   num_samples=n))
    return out


def _batches(n: int, b: int, d: int, runs: int, steps: int, seed: int
             ) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``steps`` batches of ``runs`` runs' unit-norm embeddings ``(G, B, D)`` and indices;
    later batches revisit samples of earlier ones (the moving average acts)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        za = F.normalize(torch.randn(runs, b, d, generator=g), dim=-1)
        zb = F.normalize(za + 0.7 * torch.randn(runs, b, d, generator=g), dim=-1)
        out.append((za, zb, torch.randperm(n, generator=g)[:b]))
    return out


def _alone(objectives: list[Objective], za: Tensor, zb: Tensor, index: Tensor) -> Any:
    """Each run's own objective (the per-run path of the group step), summed backward."""
    a, b = za.clone().requires_grad_(), zb.clone().requires_grad_()
    out = [objective(x, y, index, None) for objective, x, y in
           zip(objectives, a.unbind(0), b.unbind(0), strict=True)]
    torch.stack([loss for loss, _ in out]).sum().backward()
    return [loss.detach() for loss, _ in out], [logs for _, logs in out], a.grad, b.grad


def _together(group: GroupedGcl, za: Tensor, zb: Tensor, index: Tensor) -> Any:
    a, b = za.clone().requires_grad_(), zb.clone().requires_grad_()
    out = group(a, b, index, None)
    torch.stack([loss for loss, _ in out]).sum().backward()
    return [loss.detach() for loss, _ in out], [logs for _, logs in out], a.grad, b.grad


def _states(objectives: list[Objective]) -> list[Tensor]:
    return [t for o in objectives for t in (o.loss.log_u_a2b, o.loss.log_u_b2a)]


def _compare(n: int, b: int, d: int, steps: int, seed: int, exact: bool,
             **kwargs: Any) -> None:
    alone = _objectives(n, **kwargs)
    together = copy.deepcopy(alone)
    group = grouped_gcl(together, batch_size=b)
    assert group is not None
    for za, zb, index in _batches(n, b, d, len(alone), steps, seed):
        want, want_logs, want_a, want_b = _alone(alone, za, zb, index)
        got, got_logs, got_a, got_b = _together(group, za, zb, index)
        assert got_logs == want_logs
        pairs = [*zip(got, want, strict=True), (got_a, want_a), (got_b, want_b),
                 *zip(_states(together), _states(alone), strict=True)]
        for left, right in pairs:
            if exact:
                assert torch.equal(torch.nan_to_num(left, nan=7.0),
                                   torch.nan_to_num(right, nan=7.0))
            else:
                torch.testing.assert_close(left, right, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("include_positive", [False, True])
def test_bit_for_bit_at_the_study_shapes(symmetric: bool, include_positive: bool) -> None:
    """The quick study's batch of 128 and width 128, n = 500: runs with m = 5 have anchors
    without a negative in most batches."""
    _compare(500, 128, 128, steps=6, seed=0, exact=True, symmetric=symmetric,
             include_positive=include_positive)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(8, 60), b=st.integers(2, 8), d=st.integers(1, 9), seed=st.integers(0, 99),
       symmetric=st.booleans(), include_positive=st.booleans())
def test_equal_to_the_runs_own_objectives_at_any_shape(n: int, b: int, d: int, seed: int,
                                                       symmetric: bool,
                                                       include_positive: bool) -> None:
    runs = [("shared", 2), ("independent", 3), ("independent", n // 2), ("in_batch", None)]
    _compare(n, b, d, steps=3, seed=seed, exact=False, symmetric=symmetric,
             include_positive=include_positive, runs=runs)


def test_a_run_without_any_negative_in_the_batch_has_loss_zero() -> None:
    """A shared set of one sample: a batch without it gives that run nothing to estimate."""
    alone = _objectives(10, runs=[("shared", 1), ("independent", 3)])
    together = copy.deepcopy(alone)
    group = grouped_gcl(together, batch_size=4)
    assert group is not None
    sets = alone[0].negatives.sets
    assert sets is not None
    member = int(sets.mask(torch.arange(1), torch.arange(10))[0].nonzero()[0])
    index = torch.tensor([i for i in range(10) if i != member][:4])
    za, zb, _ = _batches(10, 4, 3, 2, 1, seed=1)[0]
    want, _, want_a, want_b = _alone(alone, za, zb, index)
    got, _, got_a, got_b = _together(group, za, zb, index)
    assert float(got[0]) == 0.0 == float(want[0])
    assert torch.equal(got_a, want_a) and torch.equal(got_b, want_b)
    assert not got_a[0].any()  # the run's embeddings get no gradient


def test_which_objectives_are_computed_together() -> None:
    gcl = _objectives(40, runs=[("shared", 5), ("independent", 5)])
    assert grouped_gcl(gcl, batch_size=16) is not None
    assert grouped_gcl(gcl[:1], batch_size=16) is None  # one run: its own objective
    tiled = [build_objective(LossConfig(name="gcl", block_size=8),
                             NegativesConfig(regime="shared", m=5), num_samples=40)] * 2
    assert grouped_gcl(tiled, batch_size=16) is None
    learned = [build_objective(LossConfig(name="gcl", gcl={"temperature_mode":
                                                          "global_learnable"}),
                               NegativesConfig(), num_samples=40) for _ in range(2)]
    assert grouped_gcl(learned, batch_size=16) is None
    one_way = _objectives(40, runs=[("shared", 5)]) + _objectives(40, symmetric=False,
                                                                  runs=[("shared", 5)])
    assert grouped_gcl(one_way, batch_size=16) is None
    clip = [build_objective(LossConfig(name="clip"), NegativesConfig(), num_samples=40)] * 2
    assert grouped_gcl(clip, batch_size=16) is None
    with pytest.raises(CrlValueError, match="every objective must be GCL"):
        GroupedGcl(clip)


def test_bad_shapes_name_what_came() -> None:
    group = grouped_gcl(_objectives(40, runs=[("shared", 5), ("independent", 5)]), 8)
    assert group is not None
    with pytest.raises(CrlValueError, match=r"must be \(2, B, D\).*got \(3, 8, 4\)"):
        group(torch.zeros(3, 8, 4), torch.zeros(3, 8, 4), torch.arange(8), None)
