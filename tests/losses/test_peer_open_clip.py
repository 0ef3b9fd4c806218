"""``crl.losses.ClipLoss`` called the way open_clip's training code calls its own ``ClipLoss``
(``loss(image_features, text_features, logit_scale)``, ``logit_scale`` being the multiplier
``model.logit_scale.exp()``), against open_clip's ``ClipLoss`` on the same tensors.

Only ``open_clip/loss.py`` is loaded: the package imports torchvision at import time, which does
not import with the CPU torch here (``pip install --no-deps open-clip-torch``).
"""

from __future__ import annotations

import importlib.util
import math
from types import ModuleType

import pytest
import torch

from crl.losses import ClipLoss


def _open_clip_loss_module() -> ModuleType:
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("open_clip is not installed (pip install --no-deps open-clip-torch)")
    path = f"{next(iter(spec.submodule_search_locations))}/loss.py"
    loss_spec = importlib.util.spec_from_file_location("_open_clip_loss", path)
    if loss_spec is None or loss_spec.loader is None:
        pytest.skip(f"open_clip's loss.py is not loadable from {path}")
    module = importlib.util.module_from_spec(loss_spec)
    try:
        loss_spec.loader.exec_module(module)
    except Exception as err:  # pragma: no cover - depends on the installed open_clip
        pytest.skip(f"open_clip's loss.py does not import here: {err!r}")
    return module


@pytest.fixture(scope="module")
def open_clip_loss() -> ModuleType:
    return _open_clip_loss_module()


def _inputs(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    image = torch.nn.functional.normalize(torch.randn(batch, 12, generator=g,
                                                      dtype=torch.float64), dim=1)
    text = torch.nn.functional.normalize(image + torch.randn(batch, 12, generator=g,
                                                             dtype=torch.float64), dim=1)
    logit_scale = torch.tensor(math.log(1 / 0.07), dtype=torch.float64).exp()
    return image, text, logit_scale


def _value_and_grads(loss: torch.nn.Module, image: torch.Tensor, text: torch.Tensor,
                     logit_scale: torch.Tensor, **kwargs: object
                     ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().clone().requires_grad_(True) for x in (image, text, logit_scale)]
    value = loss(*leaves, **kwargs)
    tensor = value["contrastive_loss"] if isinstance(value, dict) else value
    return tensor.detach(), list(torch.autograd.grad(tensor, leaves))


@pytest.mark.parametrize(("batch", "seed"), [(2, 0), (9, 1), (64, 2)])
def test_same_value_and_gradients_as_open_clip(open_clip_loss: ModuleType, batch: int,
                                               seed: int) -> None:
    image, text, logit_scale = _inputs(batch, seed)
    ours, our_grads = _value_and_grads(ClipLoss(), image, text, logit_scale)
    theirs, their_grads = _value_and_grads(open_clip_loss.ClipLoss(), image, text, logit_scale)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for got, want in zip(our_grads, their_grads, strict=True):  # image, text, logit_scale
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_output_dict_and_logit_bias(open_clip_loss: ModuleType) -> None:
    """``output_dict=True`` gives ``{"contrastive_loss": ...}``; a ``logit_bias`` (added to
    every logit) changes nothing in either, as it cancels in the softmax."""
    image, text, logit_scale = _inputs(7, 3)
    bias = torch.tensor(-2.5, dtype=torch.float64)
    ours = ClipLoss()(image, text, logit_scale, bias, output_dict=True)
    theirs = open_clip_loss.ClipLoss()(image, text, logit_scale, bias, output_dict=True)
    assert set(ours) == set(theirs) == {"contrastive_loss"}
    torch.testing.assert_close(ours["contrastive_loss"], theirs["contrastive_loss"],
                               rtol=1e-12, atol=1e-12)


def test_own_scale_without_a_logit_scale_argument() -> None:
    """Called crl's way (no scale given), the module uses its own learnable ``logit_scale``."""
    image, text, _ = _inputs(5, 4)
    loss = ClipLoss()
    torch.testing.assert_close(loss(image, text),
                               loss(image, text, loss.logit_scale.detach().exp().double()))
