"""What a group's runs no longer pay for, and that the answers stay the same: no final
checkpoint when the weights are not kept, optimiser steps outside the runs' RNG streams (a step
that draws is refused), no ``torch._dynamo`` import from LazyAdamW, and the numpy sorts of
``bag_rows`` against ``torch.unique``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_grouped import LINEAR, SYNTHETIC, _configs, _records

from crl.models.bag_rows import bag_rows
from crl.rundir import CHECKPOINT_FILE
from crl.train.grouped import GroupingError, fit_group


def test_no_final_checkpoint_same_runs(tmp_path: Path) -> None:
    configs = _configs(SYNTHETIC, LINEAR)[:2]  # 7 steps: a checkpoint at step 4, then the end
    kept = fit_group(configs, [tmp_path / "kept0", tmp_path / "kept1"])
    dropped = fit_group(configs, [tmp_path / "drop0", tmp_path / "drop1"],
                        final_checkpoint=False)
    for i, (a, b) in enumerate(zip(kept, dropped, strict=True)):
        assert {k: v for k, v in a.summary.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.summary.items() if not k.startswith("time/")}
        assert _records(tmp_path / f"kept{i}") == _records(tmp_path / f"drop{i}")
        last = torch.load(tmp_path / f"drop{i}" / CHECKPOINT_FILE, weights_only=True)
        assert last["step"] == 4  # the one before the end; the end's was not written
        assert torch.load(tmp_path / f"kept{i}" / CHECKPOINT_FILE,
                          weights_only=True)["step"] == 7


@pytest.mark.parametrize("stream", ["torch", "numpy", "python"])
def test_an_optimiser_step_that_draws_is_refused(stream: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from crl.losses import Objective

    draw = {"torch": lambda: torch.rand(1), "numpy": lambda: np.random.rand(),  # noqa: NPY002
            "python": random.random}[stream]

    def drawing(self: Any) -> None:
        draw()

    monkeypatch.setattr(Objective, "after_step", drawing)
    configs = _configs(SYNTHETIC, LINEAR)[:2]
    with pytest.raises(GroupingError, match="optimiser step drew random numbers"):
        fit_group(configs, [tmp_path / "a", tmp_path / "b"])


def test_lazy_adamw_does_not_import_dynamo() -> None:
    code = ("import sys, torch\n"
            "from crl.train.lazy_adamw import LazyAdamW\n"
            "bag = torch.nn.EmbeddingBag(10, 4, sparse=True)\n"
            "head = torch.nn.Linear(4, 2)\n"
            "opt = LazyAdamW([*bag.parameters(), *head.parameters()], lr=0.1)\n"
            "head(bag(torch.tensor([[1, 2]]))).sum().backward()\n"
            "opt.step(); opt.zero_grad()\n"
            "state = opt.state_dict(); opt.load_state_dict(state)\n"
            "assert bag.weight.grad is None and len(state['state']) == 3\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def _reference_pairs(ids: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (id, text) pairs and counts as torch.unique gives them, and the stable text order."""
    batch, length = ids.shape
    keep = ids != pad_id
    texts = torch.arange(batch).unsqueeze(1).expand(batch, length)[keep]
    pairs, _ = torch.unique(ids[keep].long() * batch + texts, sorted=True, return_counts=True)
    return pairs.div(batch, rounding_mode="floor"), pairs.remainder(batch)


@pytest.mark.parametrize("seed", range(4))
def test_bag_rows_matrices_match_torch_sorts(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (32, 20), generator=gen)  # repeats, pads (0) and empty texts
    ids[3] = 0
    rows = bag_rows(ids, pad_id=0)
    pair_ids, pair_texts = _reference_pairs(ids, 0)
    assert torch.equal(rows.rows, torch.unique(pair_ids))
    # the transpose's CSR: columns (texts) ascending within each row id
    assert torch.equal(rows.weights_t.col_indices(), pair_texts)
    by_text = torch.sort(pair_texts, stable=True).indices
    columns = torch.searchsorted(rows.rows, pair_ids)
    assert torch.equal(rows.weights.col_indices(), columns[by_text])
    assert torch.equal(rows.weights.values(), rows.weights_t.values()[by_text])
    dense = torch.zeros(32, 50)
    dense.scatter_add_(1, ids, torch.ones(32, 20))
    dense[:, 0] = 0
    expected = dense / dense.sum(dim=1, keepdim=True).clamp_min(1)
    assert torch.allclose(rows.weights.to_dense(), expected[:, rows.rows])


def test_shared_bag_rows_once_per_unchanged_ids() -> None:
    from crl.models.bag_rows import shared_bag_rows

    ids = torch.tensor([[5, 7, 5, 0], [1, 0, 0, 0], [2, 2, 3, 4]])
    outside = bag_rows(ids[:2], pad_id=0)
    with shared_bag_rows():
        first = bag_rows(ids[:2], pad_id=0)  # a new view of the same memory: the same rows
        assert bag_rows(ids[:2], pad_id=0) is first
        assert bag_rows(ids[1:], pad_id=0) is not first  # other rows of it
        assert bag_rows(ids[:2].clone(), pad_id=0) is not first  # other memory
        ids[0, 1] = 9  # changed in place: its version moved on
        changed = bag_rows(ids[:2], pad_id=0)
        with shared_bag_rows():  # nested: the same memo
            assert bag_rows(ids[:2], pad_id=0) is changed
    assert changed is not first and changed.rows.tolist() == [1, 5, 9]
    assert torch.equal(first.rows, outside.rows) and bag_rows(ids[:2], pad_id=0) is not changed
