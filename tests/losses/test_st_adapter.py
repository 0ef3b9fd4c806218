"""crl's sentence-transformers loss (:mod:`crl.losses.sentence_transformers`): the same values and
gradients as sentence-transformers' own ``MultipleNegativesRankingLoss`` on the same tensors, hard
negatives of an anchor's own against a loop from the formula, GCL against crl's module, and a few
steps of ``SentenceTransformerTrainer`` on a tiny BERT built from a config."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import (
    MultipleNegativesRankingLoss,
)

from crl.errors import CrlValueError
from crl.losses import GlobalContrastiveLoss
from crl.losses.sentence_transformers import CrlContrastiveLoss
from crl.negatives import NegativesConfig, build_negative_sets

WORDS = ("def return add two numbers sum list sort open file read write parse string int value "
         "the a of to from path join split lines").split()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> SentenceTransformer:
    """A one-layer BERT (width 16) with a word-level vocabulary, mean pooling."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path: Path = tmp_path_factory.mktemp("tiny-bert")
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                               *WORDS]) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    config = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    transformer = Transformer(str(path), max_seq_length=32)
    return SentenceTransformer(modules=[transformer, Pooling(16, "mean")], device="cpu")


def _columns(batch: int, hard: int, seed: int = 0) -> list[Tensor]:
    """Leaf float64 embeddings ``[anchor, positive, negative_1, ...]``, each ``(B, 8)``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 8, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2 + hard)]


def _value_and_grads(loss: torch.nn.Module, columns: list[Tensor],
                     labels: Tensor | None = None) -> tuple[float, list[Tensor]]:
    fresh = [c.detach().clone().requires_grad_(True) for c in columns]
    value = loss.compute_loss_from_embeddings(fresh, labels)
    value.backward()
    return float(value.detach()), [c.grad for c in fresh]


@pytest.mark.parametrize(("hard", "symmetric", "block_size"),
                         [(0, False, None), (0, True, None), (2, False, None), (2, True, 3),
                          (0, False, 4)])
def test_matches_multiple_negatives_ranking_loss(tiny_model: SentenceTransformer, hard: int,
                                                 symmetric: bool, block_size: int | None) -> None:
    """Scale 20, cosine similarity; hard negatives shared by the batch as MNRL scores them."""
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    ours = CrlContrastiveLoss(tiny_model, scale=20.0, symmetric=symmetric,
                              hard_negatives="batch", block_size=block_size)
    theirs = MultipleNegativesRankingLoss(tiny_model, scale=20.0, directions=directions,
                                          partition_mode="per_direction")
    columns = _columns(batch=7, hard=hard)
    value, grads = _value_and_grads(ours, columns)
    expected, expected_grads = _value_and_grads(theirs, columns)
    assert value == pytest.approx(expected, rel=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_in_batch_through_the_model_matches_mnrl(tiny_model: SentenceTransformer) -> None:
    """The same tokenised batch through the model: the same loss and parameter gradients."""
    tiny_model.eval()  # no dropout: both calls see the same embeddings
    texts = [["add two numbers", "sort a list", "open the file", "read lines"],
             ["def add return", "sort list", "open file", "read split lines"]]
    features = [tiny_model.tokenize(t) for t in texts]

    def run(loss: torch.nn.Module) -> tuple[float, list[Tensor]]:
        tiny_model.zero_grad()
        value = loss(features, None)
        value.backward()
        return float(value.detach()), [p.grad.clone() for p in tiny_model.parameters()
                              if p.grad is not None]

    value, grads = run(CrlContrastiveLoss(tiny_model))
    expected, expected_grads = run(MultipleNegativesRankingLoss(tiny_model))
    assert value == pytest.approx(expected, rel=1e-6)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def _reference_own_hard(columns: list[Tensor], scale: float,
                        negatives: Tensor | None = None) -> Tensor:
    """Anchor i's candidates: its positive, the other positives (or those ``negatives[i]``
    allows) and its own hard negatives; a loop over anchors from the formula."""
    za, zb, *hard = (F.normalize(c, dim=-1) for c in columns)
    batch = za.shape[0]
    terms = []
    for i in range(batch):
        logits = [scale * za[i] @ zb[i]]
        logits += [scale * za[i] @ zb[j] for j in range(batch)
                   if j != i and (negatives is None or bool(negatives[i, j]))]
        logits += [scale * za[i] @ h[i] for h in hard]
        stacked = torch.stack(logits)
        terms.append(torch.logsumexp(stacked, 0) - stacked[0])
    return torch.stack(terms).mean()


def test_own_hard_negatives_against_the_formula(tiny_model: SentenceTransformer) -> None:
    columns = _columns(batch=6, hard=3, seed=1)
    value, grads = _value_and_grads(CrlContrastiveLoss(tiny_model, scale=20.0), columns)
    fresh = [c.detach().clone().requires_grad_(True) for c in columns]
    expected = _reference_own_hard(fresh, 20.0)
    expected.backward()
    assert value == pytest.approx(float(expected.detach()), rel=1e-10)
    for got, c in zip(grads, fresh, strict=True):
        torch.testing.assert_close(got, c.grad, rtol=1e-9, atol=1e-12)


def test_m_negatives_per_anchor_use_the_label_indices(tiny_model: SentenceTransformer) -> None:
    """``regime: independent`` with ``m``: anchor i's negatives are its set among the batch's
    indices, which come from the ``label`` column."""
    negatives = NegativesConfig(regime="independent", m=5, seed=3)
    loss = CrlContrastiveLoss(tiny_model, negatives=negatives, num_samples=20)
    index = torch.tensor([3, 17, 0, 9, 12, 5, 8, 11])
    columns = _columns(batch=8, hard=1, seed=2)
    value, _ = _value_and_grads(loss, columns, labels=index)
    sets = build_negative_sets(negatives, 20)
    assert sets is not None
    mask = sets.batch_mask(index)
    expected = _reference_own_hard([c.detach() for c in columns], 20.0, negatives=mask)
    assert value == pytest.approx(float(expected.detach()), rel=1e-10)


def test_gcl_matches_crl_module_over_two_steps(tiny_model: SentenceTransformer) -> None:
    """GCL through the adapter: crl's GlobalContrastiveLoss on the normalised embeddings, the
    same running estimates after two steps."""
    loss = CrlContrastiveLoss(tiny_model, loss="gcl", scale=10.0, symmetric=True, num_samples=30)
    module = GlobalContrastiveLoss(30, temperature=0.1, symmetric=True)
    for step, index in enumerate((torch.tensor([4, 9, 2, 28, 7]), torch.tensor([9, 4, 1, 2, 3]))):
        columns = _columns(batch=5, hard=0, seed=10 + step)
        value, grads = _value_and_grads(loss, columns, labels=index)
        fresh = [c.detach().clone().requires_grad_(True) for c in columns]
        expected = module(F.normalize(fresh[0], dim=-1), F.normalize(fresh[1], dim=-1), index)
        expected.backward()
        assert value == pytest.approx(float(expected.detach()), rel=1e-10)
        for got, c in zip(grads, fresh, strict=True):
            torch.testing.assert_close(got, c.grad, rtol=1e-9, atol=1e-12)
    state = loss.objective.state_dict()
    log_u = next(v for k, v in state.items() if k.endswith("log_u_a2b"))
    torch.testing.assert_close(log_u, module.log_u_a2b, equal_nan=True)


def _dataset(columns: dict[str, list[object]]) -> object:
    """A ``datasets.Dataset`` built from an Arrow table (``from_dict`` fingerprints by pickling,
    which failed here with datasets 5 and pyarrow)."""
    datasets = pytest.importorskip("datasets", reason="the trainer needs `datasets`")
    pa = pytest.importorskip("pyarrow")
    return datasets.Dataset(pa.table(columns))


@pytest.mark.parametrize("loss_name", ["info_nce", "gcl"])
def test_trains_in_sentence_transformer_trainer(tiny_model: SentenceTransformer, tmp_path: Path,
                                                loss_name: str) -> None:
    """A few steps of ``SentenceTransformerTrainer`` with a hard-negative column (and, for GCL,
    the pair indices as the ``label`` column): the loss is finite, the weights move and GCL has
    an estimate for every trained pair."""
    pytest.importorskip("accelerate", reason="the trainer needs `accelerate`")
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )

    anchors = ["add two numbers", "sort a list", "open a file", "read the file", "parse int value",
               "write string", "join path", "split lines"]
    positives = ["def add return", "sort list", "open file", "read file", "parse int",
                 "write string", "path join", "split lines"]
    rows: dict[str, list[object]] = {"anchor": anchors, "positive": positives,
                                     "negative": positives[1:] + positives[:1]}
    if loss_name == "gcl":
        rows["label"] = list(range(len(anchors)))
    loss = CrlContrastiveLoss(tiny_model, loss=loss_name,  # type: ignore[arg-type]
                              num_samples=len(anchors) if loss_name == "gcl" else None)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=2,
        learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True, seed=0,
        dataloader_drop_last=True, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=tiny_model, args=args, loss=loss,
                                         train_dataset=_dataset(rows))
    result = trainer.train()
    assert result.global_step == 4
    assert math.isfinite(result.training_loss)
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, tiny_model.parameters(),
                                                               strict=True))
    if loss_name == "gcl":
        log_u = next(v for k, v in loss.objective.state_dict().items() if k.endswith("log_u_a2b"))
        assert bool(torch.isfinite(log_u).all())


def test_errors_name_the_fix(tiny_model: SentenceTransformer) -> None:
    with pytest.raises(CrlValueError, match="num_samples"):
        CrlContrastiveLoss(tiny_model, loss="gcl")
    with pytest.raises(CrlValueError, match="hard_negatives='own'"):
        CrlContrastiveLoss(tiny_model, loss="gcl", num_samples=4, hard_negatives="batch")
    with pytest.raises(CrlValueError, match="add_column"):
        CrlContrastiveLoss(tiny_model, loss="gcl", num_samples=8).compute_loss_from_embeddings(
            _columns(4, 0), None)
    with pytest.raises(CrlValueError, match="at least two columns"):
        CrlContrastiveLoss(tiny_model).compute_loss_from_embeddings(_columns(4, 0)[:1], None)
