"""Retrieval metrics at Matryoshka prefixes (:mod:`crl.eval.prefixes`): each prefix's metrics
are those of its cut, renormalised embeddings; the full dimension is not repeated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from crl.eval import retrieval_metrics
from crl.eval.prefixes import prefix_retrieval_metrics


@pytest.mark.parametrize("normalize", [True, False])
def test_each_prefix_is_its_cut(normalize: bool) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = (F.normalize(torch.randn(40, 12, generator=g), dim=-1) for _ in range(2))
    hard = torch.randn(40, 3, 12, generator=g)
    out = prefix_retrieval_metrics(a, b, [12, 6, 2], normalize=normalize, ks=(1, 5),
                                   block_size=7, hard=hard)
    assert {key.split("/")[0] for key in out} == {"retrieval_dim6", "retrieval_dim2"}
    for dim in (6, 2):
        cut = [z[..., :dim] for z in (a, b, hard)]
        if normalize:
            cut = [F.normalize(z, dim=-1) for z in cut]
        want = retrieval_metrics(cut[0], cut[1], ks=(1, 5), hard=cut[2])
        got = {key.replace(f"retrieval_dim{dim}/", "retrieval/"): value
               for key, value in out.items() if key.startswith(f"retrieval_dim{dim}/")}
        assert got == pytest.approx(want, rel=1e-6)
    assert prefix_retrieval_metrics(a, b, [], normalize=True) == {}
