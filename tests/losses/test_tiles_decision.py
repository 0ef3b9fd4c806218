"""Plain or tiled is decided once (``crl.losses.tiled.decide_tiles``), travels with the batch
(``PairBatch.tiles``) and ``block_size="plain"`` forces the plain path at any size."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import crl.losses.tiled as tiled_module
from crl.errors import CrlTypeError, CrlValueError
from crl.losses import (
    OBJECTIVES,
    GlobalContrastiveLoss,
    LossConfig,
    PairBatch,
    anchor_logsumexp,
    build_objective,
    clip_loss,
    info_nce,
)
from crl.losses.tiled import DEFAULT_BLOCK_SIZE, decide_tiles
from crl.negatives import NegativesConfig

_TILED = [name for name, cls in OBJECTIVES.items() if cls.tiled_path]


def _pair(batch: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, 4, generator=g, dtype=torch.float64)
    b = a + torch.randn(batch, 4, generator=g, dtype=torch.float64)
    return torch.nn.functional.normalize(a, dim=1), torch.nn.functional.normalize(b, dim=1)


def test_the_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    assert decide_tiles("f", None, 2048, 2048) == "plain"
    assert decide_tiles("f", None, 2049, 2048) == min(DEFAULT_BLOCK_SIZE, 2049)
    assert decide_tiles("f", "plain", 10**6, 10**6) == "plain"
    assert decide_tiles("f", 5, 3, 8) == 5 and decide_tiles("f", 50, 3, 8) == 8
    monkeypatch.setattr(tiled_module, "PLAIN_MAX_BATCH", 2)  # read at each call
    assert decide_tiles("f", None, 2, 3) == 3 and decide_tiles("f", None, 2, 2) == "plain"
    with pytest.raises(CrlTypeError, match=r"f: `block_size` must be None \(automatic\), 'plain' "
                                           r"or an integer >= 1 .*got 'tiled'"):
        decide_tiles("f", "tiled", 2, 2)
    with pytest.raises(CrlValueError, match=r"block_size.*>= 1.*got 0"):
        decide_tiles("f", 0, 2, 2)


def _kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    kernel = tiled_module.tiled_logsumexp

    def spy(*args: Any) -> Any:
        calls.append(int(args[3]))  # the tile side
        return kernel(*args)

    monkeypatch.setattr(tiled_module, "tiled_logsumexp", spy)
    return calls


def test_plain_forces_the_plain_path_where_none_would_tile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(12, seed=0)
    want_clip, want_nce = clip_loss(a, b, 5.0), info_nce(a, b, temperature=0.2, symmetric=True)
    want_lse = anchor_logsumexp(a, b, 5.0).lse
    monkeypatch.setattr(tiled_module, "PLAIN_MAX_BATCH", 4)
    calls = _kernel_calls(monkeypatch)
    assert torch.equal(clip_loss(a, b, 5.0, block_size="plain"), want_clip)
    assert torch.equal(info_nce(a, b, temperature=0.2, symmetric=True, block_size="plain"),
                       want_nce)
    assert torch.equal(anchor_logsumexp(a, b, 5.0, block_size="plain").lse, want_lse)
    assert calls == []
    clip_loss(a, b, 5.0)  # None at B = 12 > 4: tiles
    assert calls == [12]


@pytest.mark.parametrize("name", _TILED)
@pytest.mark.parametrize("block_size", [None, "plain", 5])
def test_the_batch_carries_the_objectives_decision(name: str, block_size: int | str | None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The objective decides from the loss's block_size and the batch; the loss's terms take
    that path (the kernel runs exactly when the batch says tiles) and nothing asks again."""
    monkeypatch.setattr(tiled_module, "PLAIN_MAX_BATCH", 4)  # B = 12: None means tiles
    cfg = LossConfig(name=name, temperature=0.3, block_size=block_size)  # type: ignore[arg-type]
    objective = build_objective(cfg, NegativesConfig(), num_samples=40).double()
    seen: list[object] = []
    terms = objective.loss.terms

    def spy(batch: PairBatch, **kwargs: Any) -> Any:
        seen.append(batch.tiles)
        return terms(batch, **kwargs)

    monkeypatch.setattr(objective.loss, "terms", spy)
    calls = _kernel_calls(monkeypatch)
    a, b = _pair(12, seed=1)
    objective(a, b, torch.arange(12), rows=slice(0, 6))
    want = {None: 12, "plain": "plain", 5: 5}[block_size]
    assert seen == [want]
    assert (calls != []) == (want != "plain")
    assert all(side == want for side in calls)


def test_the_config_and_gcl_take_plain() -> None:
    assert LossConfig(block_size="plain").block_size == "plain"
    assert LossConfig(block_size=3).block_size == 3
    for bad in (0, "tiled"):
        with pytest.raises(ValueError, match="block_size"):
            LossConfig(block_size=bad)  # type: ignore[arg-type]
    assert GlobalContrastiveLoss(10, block_size="plain").block_size == "plain"
    with pytest.raises(CrlTypeError, match="'plain'"):
        GlobalContrastiveLoss(10, block_size="tiles")  # type: ignore[arg-type]
