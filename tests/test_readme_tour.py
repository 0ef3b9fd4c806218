"""The README's first API snippet (losses, negative sets, GCL, a rank's share) runs as written,
and what its comments claim holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from crl.losses import info_nce
from crl.losses.tiled import anchor_logsumexp

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_loss_and_negatives_tour_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no python block"
    ns: dict[str, Any] = {}
    exec(compile(blocks[0], str(README), "exec"), ns)
    assert bool(torch.isfinite(ns["loss"]))
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
