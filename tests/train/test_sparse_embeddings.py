"""Sparse embedding gradients (``model.sparse``): the bag's sparse gradient is the dense one,
gradient clipping and its norm are the dense model's, the optimiser is chosen at build time,
and a model without a table refuses the option in one line (docs/training.md, section "Sparse
embedding gradients")."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from crl.data import DataInfo
from crl.errors import CrlValueError
from crl.experiments.negatives.grid import model_section
from crl.models import ModelConfig, build_model
from crl.models.bag import EmbeddingBagEncoder
from crl.train import validate_config
from crl.train.build import build_optimizer, sparse_parameters, trainable
from crl.train.config import OptimConfig
from crl.train.lazy_adamw import LazyAdamW
from crl.train.step import clip_gradients, clip_gradients_together

VOCAB = 60
TEXT = DataInfo("text", None, None, None, None, "pairs")


def _ids(seed: int = 0) -> torch.Tensor:
    """Token ids ``(B, L)`` with pads at the end of some rows, repeated tokens likely."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 25, (16, 10), generator=gen)
    ids[::3, 6:] = 0
    return ids


def _bag(sparse: bool) -> EmbeddingBagEncoder:
    torch.manual_seed(0)
    return EmbeddingBagEncoder(VOCAB, 5, bigram_buckets=11, sparse=sparse)


def _grads(sparse: bool, max_norm: float = float("inf")) -> tuple[float, list[torch.Tensor]]:
    """One shared-tower backward pass (both views through the bag, as the study's model) with
    a linear head, clipped to ``max_norm``; the norm and the dense gradients."""
    bag = _bag(sparse)
    torch.manual_seed(1)
    head = torch.nn.Linear(5, 4)
    za, zb = head(bag(_ids(0))), head(bag(_ids(1)))
    ((za @ zb.T).logsumexp(dim=1) - (za * zb).sum(1)).mean().backward()
    params = [bag.bag.weight, *head.parameters()]
    norm = clip_gradients(params, max_norm)
    return float(norm), [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in params]


def test_the_sparse_bag_gradient_densified_is_the_dense_one() -> None:
    assert _bag(True).bag.sparse and not _bag(False).bag.sparse
    assert torch.equal(_bag(True).bag.weight, _bag(False).bag.weight)  # the same init
    dense_norm, dense = _grads(False)
    sparse_norm, sparse = _grads(True)
    for a, b in zip(sparse, dense, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    assert sparse[0].abs().sum() > 0 and sparse[0][0].abs().sum() == 0  # pad row: no gradient
    assert sparse_norm == pytest.approx(dense_norm, rel=1e-6)


@pytest.mark.parametrize("max_norm", [1e-3, 1.0])  # the norm is about 0.01: bites, does not
def test_grad_clip_on_a_sparse_model_equals_the_dense_models(max_norm: float) -> None:
    unclipped, _ = _grads(False)
    dense_norm, dense = _grads(False, max_norm)
    sparse_norm, sparse = _grads(True, max_norm)
    assert sparse_norm == pytest.approx(dense_norm, rel=1e-6)
    assert sparse_norm == pytest.approx(unclipped, rel=1e-6)  # the norm before clipping
    for a, b in zip(sparse, dense, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)  # float32 sums
    clipped = torch.cat([g.flatten() for g in sparse]).norm()
    # the +1e-6 of clip_grad_norm_'s scale: about 1e-4 of a norm of 0.01
    assert float(clipped) == pytest.approx(min(max_norm, unclipped), rel=1e-3)


def test_clip_gradients_without_sparse_gradients_is_clip_grad_norm() -> None:
    gen = torch.Generator().manual_seed(4)
    params = [torch.nn.Parameter(torch.zeros(7, 3)), torch.nn.Parameter(torch.zeros(3))]
    grads = [torch.randn(7, 3, generator=gen), torch.randn(3, generator=gen)]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q, g in zip(params, copies, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    assert torch.equal(clip_gradients(params, 0.3), torch.nn.utils.clip_grad_norm_(copies, 0.3))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(params, copies, strict=True))


def _run_params(sparse: bool, seed: int) -> list[torch.nn.Parameter]:
    """A bag and a head with the gradients of one backward pass (the bag's sparse or dense)."""
    bag = _bag(sparse)
    torch.manual_seed(seed)
    head = torch.nn.Linear(5, 4)
    za, zb = head(bag(_ids(seed))), head(bag(_ids(seed + 1)))
    ((za @ zb.T).logsumexp(dim=1) - (za * zb).sum(1)).mean().backward()
    return [bag.bag.weight, *head.parameters()]


@pytest.mark.parametrize("max_norms", [(float("inf"),) * 3, (1e-3, 1.0, float("inf"))])
def test_clipping_a_group_together_is_each_run_clipped_alone_bit_for_bit(
        max_norms: tuple[float, ...]) -> None:
    kinds = (True, False, True)  # sparse, dense, sparse tables
    alone = [_run_params(k, seed) for seed, k in enumerate(kinds)]
    together = [_run_params(k, seed) for seed, k in enumerate(kinds)]
    norms_alone = [clip_gradients(p, m) for p, m in zip(alone, max_norms, strict=True)]
    norms = clip_gradients_together(together, max_norms)
    for a, b in zip(norms_alone, norms, strict=True):
        assert torch.equal(a, b)
    for run_a, run_b in zip(alone, together, strict=True):
        for p, q in zip(run_a, run_b, strict=True):
            assert p.grad.is_sparse == q.grad.is_sparse
            assert torch.equal(p.grad.to_dense(), q.grad.to_dense())
    if max_norms[0] == 1e-3:  # the first run's clip bites (its norm is about 0.01)
        assert float(norms[0]) > 1e-3
        assert float(alone[0][1].grad.norm()) < float(norms[0])


def test_clipping_together_falls_back_to_one_run_at_a_time_across_dtypes() -> None:
    runs = [[torch.nn.Parameter(torch.zeros(3))], [torch.nn.Parameter(torch.zeros(3,
                                                                                  dtype=torch.float64))]]
    runs[0][0].grad = torch.tensor([3.0, 4.0, 0.0])
    runs[1][0].grad = torch.tensor([0.0, 6.0, 8.0], dtype=torch.float64)
    assert [float(n) for n in clip_gradients_together(runs, [float("inf")] * 2)] == [5.0, 10.0]


def test_a_non_finite_sparse_gradient_gives_a_non_finite_norm() -> None:
    bag = _bag(True)
    bag(_ids()).sum().backward()
    grad = bag.bag.weight.grad.coalesce()
    grad.values()[0, 0] = float("nan")
    bag.bag.weight.grad = grad
    assert not torch.isfinite(clip_gradients([bag.bag.weight], 1.0))


def test_the_optimiser_is_chosen_at_build_time() -> None:
    cfg = ModelConfig(kind="embedding_bag", embed_dim=8, token_dim=5, head="linear",
                      max_tokens=8, sparse=True)
    model = build_model(cfg, TEXT)
    tables = sparse_parameters([model])
    assert tables == [model.tower_a.backbone.bag.weight]
    params = trainable([model])
    assert len(params) > 1
    assert isinstance(build_optimizer(OptimConfig(), params, sparse=tables), LazyAdamW)
    # dense gradients: the same class, torch's AdamW kernel on every parameter
    assert isinstance(build_optimizer(OptimConfig(), params), LazyAdamW)
    assert type(build_optimizer(OptimConfig(name="sgd"), params)) is torch.optim.SGD
    dense = build_model(cfg.model_copy(update={"sparse": False}), TEXT)
    assert sparse_parameters([dense]) == []
    with pytest.raises(CrlValueError, match=r"optim\.name='adamw'.*got optim\.name='sgd'"):
        build_optimizer(OptimConfig(name="sgd"), params, sparse=tables)


def test_sparse_without_an_embedding_table_is_one_clear_error() -> None:
    with pytest.raises(ValidationError, match="sparse must be false for kind='mlp'"):
        ModelConfig(kind="mlp", sparse=True)
    with pytest.raises(CrlValueError, match=r"model\.sparse: sparse must be false") as caught:
        validate_config({"model": {"kind": "cnn", "sparse": True}})
    assert len(str(caught.value).splitlines()) == 2  # the header and the one error
    vectors = DataInfo("vector", 4, 4, None, None, "gauss")
    with pytest.raises(CrlValueError) as caught:
        build_model(ModelConfig(sparse=True), vectors)  # kind 'auto': an MLP for vectors
    message = str(caught.value)
    assert "\n" not in message
    assert "model.sparse must be false for model kind 'mlp'" in message and "'auto'" in message


def test_the_study_default_model_is_sparse_and_a_chosen_model_is_not() -> None:
    assert model_section("pycode", None)["sparse"] is True
    assert "sparse" not in model_section("pycode", "embedding_bag")
    assert "sparse" not in model_section("digits", None)
