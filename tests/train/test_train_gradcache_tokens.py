"""Gradient caching by tokens (``train.micro_batch_tokens``): each view's texts sorted by length
and packed into micro-batches within a token budget give the one-pass step's loss and gradients
(dropout off), replay the masks of their own first pass (dropout on), run in bf16 through the
tiled kernel, and the packing itself is optimal and within the budget."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import crl.losses.tiled as tiled_module
from crl.data.base import DataInfo, TextPairDataset
from crl.errors import CrlValueError
from crl.models import DualEncoder, build_model
from crl.models.config import ModelConfig
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.step import batch_loss
from crl.train.steps import loss_and_gradients
from crl.train.steps.cached import CHUNK_COST_TOKENS, _chunks, pack_by_tokens, token_lengths

pytest.importorskip("transformers")

CPU = torch.device("cpu")
TEXTS_A = ["add two numbers", "sort items by key and return the sorted list", "read",
           "open close file", "join strings with a dash between them", "count", "x",
           "split a path into its name and its suffix"]
TEXTS_B = ["def add(a, b): return a + b", "sorted(items, key=key)", "open(p).read()",
           "f = open(p); f.close()", "'-'.join(strings)", "len(values)", "x",
           "def split(p): return os.path.splitext(p)"]
B = len(TEXTS_A)


def _setup(model_dir: Path, loss: dict[str, Any] | None = None) -> tuple[Any, Any, tuple]:
    torch.manual_seed(0)
    cfg = ModelConfig(kind="transformer", pretrained=str(model_dir), head="linear",
                      embed_dim=16)
    info = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                    name="texts")
    model = build_model(cfg, info)
    xa, xb = model.prepare(TextPairDataset(TEXTS_A, TEXTS_B)).eval_views()
    objective = run_objective(TrainConfig.model_validate({"loss": loss or {"name": "clip"}}),
                              num_samples=B, labels=None, epochs=1, num_classes=None)
    return model, objective, (xa, xb, torch.arange(B), torch.full((B,), -1))


def _grads(model: Any, objective: Any, batch: tuple, **step: Any) -> tuple[float, dict]:
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    torch.manual_seed(3)
    value, _ = loss_and_gradients(model, objective, batch, device=CPU, **step)
    return value, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def _assert_close(got: tuple[float, dict], want: tuple[float, dict]) -> None:
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    assert got[1].keys() == want[1].keys() and len(want[1]) > 10
    floor = 1e-4 * max(float(g.abs().max()) for g in want[1].values())  # exact zeros' noise
    for key, g in want[1].items():
        scale = max(float(g.abs().max()), floor)
        assert float((got[1][key] - g).abs().max()) <= 1e-5 * scale, key


@pytest.mark.parametrize("step", [{"micro_batch_tokens": 12},
                                  {"micro_batch_tokens": 40, "micro_batch_size": 2},
                                  {"micro_batch_tokens": 10_000}])
def test_token_micro_batches_match_one_pass(tiny_bert: Path, step: dict[str, int]) -> None:
    model, objective, batch = _setup(tiny_bert)
    model.eval()  # no dropout: one pass and any cut give the same numbers
    lengths = token_lengths(batch[0], "a")
    assert int(lengths.max()) > 2 * int(lengths.min())  # the sort has something to do
    _assert_close(_grads(model, objective, batch, **step), _grads(model, objective, batch))


def test_micro_batches_of_k_texts_are_cut_from_the_length_sorted_view(tiny_bert: Path) -> None:
    """``micro_batch_size: k`` on token inputs: k texts of similar length at a time (the
    view sorted by length, longest first), the one-pass numbers; one micro-batch keeps the
    rows as they are (nothing to save, the one pass's dropout draws); vectors stay consecutive."""
    model, objective, batch = _setup(tiny_bert)
    xa = batch[0]
    chunks, order = _chunks(xa, "a", 1, 3, None)
    lengths = token_lengths(xa, "a")
    assert order is not None and [len(c) for c in chunks] == [3, 3, 2]
    assert torch.equal(torch.cat(chunks), order)
    assert lengths[order].tolist() == sorted(lengths.tolist(), reverse=True)
    padded = sum(len(c) * int(lengths[c].max()) for c in chunks)
    consecutive = sum(int(lengths[s:s + 3].max()) * len(lengths[s:s + 3]) for s in (0, 3, 6))
    assert padded < consecutive  # what the sort saves on these texts
    whole, none = _chunks(xa, "a", 1, B, None)
    assert none is None and whole == [slice(0, B)]
    vectors, kept = _chunks(torch.randn(5, 4), "a", 1, 2, None)
    assert kept is None and vectors == [slice(0, 2), slice(2, 4), slice(4, 5)]
    model.eval()
    _assert_close(_grads(model, objective, batch, micro_batch_size=3),
                  _grads(model, objective, batch))


def test_token_micro_batches_replay_their_dropout_masks(tiny_bert: Path) -> None:
    """Dropout on: the step equals one graph over the same micro-batches, embedded in the
    cache's order (a and b micro-batches alternating), put back in row order."""
    model, objective, batch = _setup(tiny_bert)
    model.train()
    cached = _grads(model, objective, batch, micro_batch_tokens=24)
    ref_model, ref_objective = copy.deepcopy(model), copy.deepcopy(objective)
    torch.manual_seed(3)
    xa, xb, index, labels = batch
    plans = [pack_by_tokens(token_lengths(x, "ab"[i]), 24) for i, x in enumerate((xa, xb))]
    parts: list[list[torch.Tensor]] = [[], []]
    for round_ in itertools.zip_longest(*(chunks for _, chunks in plans)):
        for v, rows in enumerate(round_):
            if rows is not None:
                encode = ref_model.encode_a if v == 0 else ref_model.encode_b
                parts[v].append(encode((xa, xb)[v][rows]))
    za, zb = (torch.cat(part)[torch.argsort(order)]  # back to row order
              for part, (order, _) in zip(parts, plans, strict=True))
    loss, _ = batch_loss(ref_objective, ref_model, (za, zb, None), index, labels)
    loss.backward()
    want = (float(loss.detach()), {k: p.grad for k, p in ref_model.named_parameters()
                                   if p.grad is not None})
    _assert_close(cached, want)
    assert cached[0] != pytest.approx(_grads(model, objective, batch)[0], rel=1e-4)


def test_token_micro_batches_in_bf16_reach_the_tiled_kernel(
        tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, objective, batch = _setup(tiny_bert, {"name": "clip", "block_size": 4})
    model.eval()
    seen: list[torch.dtype] = []
    kernel = tiled_module.tiled_logsumexp

    def spy(a: torch.Tensor, b: torch.Tensor, *args: Any) -> Any:
        seen.extend([a.dtype, b.dtype])
        return kernel(a, b, *args)

    monkeypatch.setattr(tiled_module, "tiled_logsumexp", spy)
    bf16 = _grads(model, objective, batch, micro_batch_tokens=16, precision="bf16")
    assert seen and set(seen) == {torch.bfloat16}
    fp32 = _grads(model, objective, batch)
    assert abs(bf16[0] - fp32[0]) <= 1e-2 * abs(fp32[0])
    got = torch.cat([g.flatten() for g in bf16[1].values()])
    want = torch.cat([g.flatten() for g in fp32[1].values()])
    assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) > 0.99


def test_token_budget_needs_token_inputs() -> None:
    model = DualEncoder(torch.nn.Linear(4, 3), torch.nn.Linear(4, 3))
    objective = run_objective(TrainConfig.model_validate({"loss": {"name": "clip"}}),
                              num_samples=4, labels=None, epochs=1, num_classes=None)
    batch = (torch.randn(4, 4), torch.randn(4, 4), torch.arange(4), torch.full((4,), -1))
    with pytest.raises(CrlValueError, match=r"train\.micro_batch_tokens.*view a.*float32"):
        loss_and_gradients(model, objective, batch, device=CPU, micro_batch_tokens=8)


def _brute_force_cost(widths: list[int], budget: int, cap: int) -> float:
    """The least padded tokens + per-chunk cost over every way to cut the sorted widths."""
    n, best = len(widths), float("inf")
    for cuts in itertools.product((False, True), repeat=n - 1):
        starts = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        sizes = [(s, e - s) for s, e in itertools.pairwise(starts)]
        if all(size <= cap and (size == 1 or size * widths[s] <= budget) for s, size in sizes):
            best = min(best, sum(size * widths[s] + CHUNK_COST_TOKENS for s, size in sizes))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=8), st.integers(1, 900),
       st.integers(1, 9))
def test_packing_is_a_sorted_cover_within_the_budget_and_optimal(
        lengths: list[int], budget: int, cap: int) -> None:
    order, chunks = pack_by_tokens(torch.tensor(lengths), budget, cap)
    assert torch.equal(torch.cat(chunks), order)
    assert sorted(order.tolist()) == list(range(len(lengths)))
    widths = [lengths[i] for i in order.tolist()]
    assert widths == sorted(lengths, reverse=True)
    for chunk in chunks:
        rows = [lengths[i] for i in chunk.tolist()]
        assert len(rows) <= cap
        assert len(rows) == 1 or len(rows) * max(rows) <= budget
    got = sum(len(c) * max(lengths[i] for i in c.tolist()) + CHUNK_COST_TOKENS for c in chunks)
    assert got == pytest.approx(_brute_force_cost(widths, budget, cap))


def test_config_takes_a_token_budget() -> None:
    options = TrainConfig.model_validate({"model": {"kind": "transformer"},
                                          "train": {"micro_batch_tokens": 4096}}).train
    assert options.micro_batch_tokens == 4096 and options.micro_batch_size is None
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TrainConfig.model_validate({"model": {"kind": "transformer"},
                                    "train": {"micro_batch_tokens": 0}})
    # a model that takes no tokens is refused when the config is read, before any run starts
    for kind in ("auto", "mlp", "embedding_bag"):
        with pytest.raises(ValueError, match=f"model.kind is '{kind}'"):
            TrainConfig.model_validate({"model": {"kind": kind},
                                        "train": {"micro_batch_tokens": 4096}})
