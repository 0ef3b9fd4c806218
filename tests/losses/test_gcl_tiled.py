"""GCL over tiles (``block_size``) equals GCL on the dense score matrix: the loss, the gradients
and the ``u`` state, with dense masks, NegativeSets, empty rows and every temperature mode."""

from __future__ import annotations

import pytest
import torch

import crl.losses.tiled as tiled_module
from crl.errors import CrlTypeError, CrlValueError
from crl.losses import GlobalContrastiveLoss
from crl.negatives import NegativeSets
from shared_tensors import make_pair


def _pair(batch: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return make_pair(batch, dim, seed=seed, noise=0.5, normalize=True)


@pytest.mark.parametrize("mode", ["fixed", "global_learnable", "per_sample"])
@pytest.mark.parametrize("masking", ["none", "dense", "sets", "sets_per_tile"])
def test_tiled_gcl_equals_dense(mode: str, masking: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if masking == "sets_per_tile":  # the sets asked tile by tile, as for a huge batch
        monkeypatch.setattr(tiled_module, "DENSE_MASK_MAX_ENTRIES", 0)
    n, batch = 200, 37
    sets = NegativeSets(n, 12, regime="independent", seed=3)
    dense = GlobalContrastiveLoss(n, temperature=0.1, temperature_mode=mode)  # type: ignore[arg-type]
    tiled = GlobalContrastiveLoss(n, temperature=0.1, temperature_mode=mode,  # type: ignore[arg-type]
                                  block_size=8)
    tiled.load_state_dict(dense.state_dict())
    for step in range(3):  # later steps mix into existing u
        index = torch.randperm(n, generator=torch.Generator().manual_seed(step))[:batch]
        mask = sets.batch_mask(index)
        dense_mask = None if masking == "none" else mask
        tiled_mask = {"none": None, "dense": mask, "sets": sets, "sets_per_tile": sets}[masking]
        grads = []
        for module, m in ((dense, dense_mask), (tiled, tiled_mask)):
            a, b = (x.clone().requires_grad_(True) for x in _pair(batch, 16, step))
            loss = module(a, b, index, negatives_mask=m)
            params = [p for p in module.parameters()]
            grads.append((loss.detach(), *torch.autograd.grad(loss, [a, b, *params])))
        for x, y in zip(grads[0], grads[1], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
        for name in ("log_u_a2b", "log_u_b2a"):
            torch.testing.assert_close(getattr(dense, name), getattr(tiled, name),
                                       rtol=1e-10, atol=1e-12, equal_nan=True)


def test_tiled_gcl_skips_anchors_without_negatives() -> None:
    n, batch = 1000, 16
    sets = NegativeSets(n, 3, regime="shared", seed=0)  # most anchors have none in a batch
    index = torch.arange(batch)
    a, b = _pair(batch, 8, 0)
    dense = GlobalContrastiveLoss(n, temperature=0.05)
    tiled = GlobalContrastiveLoss(n, temperature=0.05, block_size=4)
    torch.testing.assert_close(dense(a, b, index, negatives_mask=sets.batch_mask(index)),
                               tiled(a, b, index, negatives_mask=sets))
    torch.testing.assert_close(dense.log_u_a2b, tiled.log_u_a2b, equal_nan=True)


def test_tile_mask_without_block_size_and_bad_block_size() -> None:
    # Without block_size a TileMask is asked for the rows' whole mask at once: same result.
    sets = NegativeSets(100, 10, regime="shared", seed=0)
    a, b = _pair(6, 3, 0)
    index = torch.tensor([3, 50, 7, 99, 12, 64])
    plain, dense = GlobalContrastiveLoss(100), GlobalContrastiveLoss(100)
    torch.testing.assert_close(plain(a, b, index, negatives_mask=sets),
                               dense(a, b, index, negatives_mask=sets.batch_mask(index)),
                               rtol=0.0, atol=0.0)
    torch.testing.assert_close(plain.log_u_b2a, dense.log_u_b2a, equal_nan=True)
    with pytest.raises(CrlTypeError, match="negatives_mask"):
        GlobalContrastiveLoss(100)(a, b, index, negatives_mask="sets")  # type: ignore[arg-type]
    with pytest.raises(CrlValueError, match="block_size"):
        GlobalContrastiveLoss(100, block_size=0)
