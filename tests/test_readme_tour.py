"""Every Python snippet of the README runs as written, on its own, twice in a row, and what its
comments claim holds (the first: losses, negative sets, GCL, a rank's share; the second: the
calibration bound and m*; the third: a training run and retrieval metrics; the fourth: mining,
qrels, the guide and Matryoshka)."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.losses import info_nce
from crl.losses.tiled import anchor_logsumexp

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _run(block: str) -> tuple[dict[str, Any], list[str]]:
    """Execute ``block`` in a fresh namespace (nothing shared with other snippets)."""
    ns: dict[str, Any] = {"__name__": "__readme__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(README), "exec"), ns)
    return ns, out.getvalue().splitlines()


def test_the_readme_has_four_snippets() -> None:
    assert len(BLOCKS) == 4, "a new README snippet needs its checks here"


def test_the_loss_and_negatives_tour_runs() -> None:
    ns, printed = _run(BLOCKS[0])
    assert bool(torch.isfinite(ns["loss"]))
    first = float(printed[0])  # "about 2; log(256) = 5.5 at chance"
    assert 1.0 < first < 3.0 < math.log(256)
    assert float(printed[1]) < 0  # the contrastive risk: positives beat their negatives
    # "4 ranks: mean = InfoNCE with these sets"
    a, b, index, sets = ns["a"], ns["b"], ns["index"], ns["sets"]
    shares = []
    for r in range(4):
        own = slice(64 * r, 64 * (r + 1))
        out = anchor_logsumexp(a[own], b, 1 / 0.07, offset=own.start, negatives_mask=sets,
                               anchor_index=index[own], candidate_index=index)
        shares.append((out.lse - out.positive).mean())
    assert torch.equal(shares[1], ns["share"])
    whole = info_nce(a, b, temperature=0.07, negatives_mask=sets.batch_mask(index))
    torch.testing.assert_close(torch.stack(shares).mean(), whole, rtol=1e-5, atol=1e-5)
    share, gcl = (float(v) for v in printed[2].split())
    assert share == pytest.approx(float(ns["share"])) and gcl == pytest.approx(0.1)  # = tau


def test_the_theory_tour_runs() -> None:
    _, printed = _run(BLOCKS[1])
    excess_risk, excess_auc, bound = (float(v) for v in printed[0].split())
    assert 0 < excess_auc <= bound and excess_risk > 0
    assert bound == pytest.approx(math.sqrt(2 * excess_risk / 1.0))
    assert printed[1] == "[0.79, 0.4, 0.2]"  # the comment's m*/n = 25 / sqrt(n)
    assert float(printed[2]) == pytest.approx(0.5, abs=0.01)


@pytest.mark.slow
def test_the_training_tour_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ns, printed = _run(BLOCKS[2])
    auc = float(printed[0])
    assert 0.7 < auc < 0.789  # "held-out AUC ~0.75; the best is E* = 0.789"
    recall, median = (float(v) for v in printed[1].split())
    assert 0 < recall < 1 and median >= 1
    run_dir = tmp_path / ns["run_dir"]
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    again, printed_again = _run(BLOCKS[2])  # the same directory: the finished run comes back
    assert again["result"].finished and printed_again[0] == printed[0]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]


def test_the_retrieval_loop_tour_runs() -> None:
    ns, printed = _run(BLOCKS[3])
    assert printed[0] == "(200, 2) True"  # "(200, 2) rows of doc ids, never the positive"
    hard, scores, queries, docs = ns["hard"], ns["scores"], ns["queries"], ns["docs"]
    positive = (queries * docs[:200]).sum(dim=1, keepdim=True)  # (200, 1)
    assert bool((scores <= 0.95 * positive).all())  # "those above 95% of the positive's dropped"
    torch.testing.assert_close(scores, (queries[:, None] * docs[hard]).sum(-1))
    ndcg, recall = (float(v) for v in printed[1].split())
    assert ndcg > 0.99 and recall == 1.0  # "> 0.99 and 1.0 here"
    assert printed[2] == "False False True"  # the duplicate masked both ways, doc 2 kept
    assert printed[3] == "True"  # the guided loss is lower
    nested, by_hand = (float(v) for v in printed[4].split())
    assert nested == pytest.approx(by_hand, rel=1e-6)  # "the same number twice"
    prefix, full = (float(v) for v in printed[5].split())
    assert prefix < full  # "lower on 16"
