"""A ``--config`` study keeps the config's loss and its options when the loss takes negative
sets, refuses one that does not in one line naming those that can, and trains ``--loss``
when given; the recommendation is written as a config fragment to paste."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from crl.errors import CrlValueError
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.grid import set_losses


def _config(tmp_path: Path, loss: dict[str, object]) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data": {"name": "synthetic"},
                                    "model": {"kind": "mlp", "embed_dim": 8},
                                    "loss": loss}))
    return str(path)


def test_the_configs_loss_stays_with_its_options(tmp_path: Path) -> None:
    path = _config(tmp_path, {"name": "clip", "temperature": 0.07})  # in-batch in the config
    specs = NegativesStudy("smoke", config=path, ns=[64, 128], seeds=[0]).runs()
    assert {s.config["loss"]["name"] for s in specs} == {"clip"}
    assert {s.config["loss"]["temperature"] for s in specs} == {0.07}
    assert {s.config["negatives"]["regime"] for s in specs} == {"shared", "independent"}


def test_a_loss_without_negative_sets_is_refused_unless_loss_is_given(tmp_path: Path) -> None:
    path = _config(tmp_path, {"name": "siglip"})
    with pytest.raises(CrlValueError) as caught:
        NegativesStudy("smoke", config=path)
    message = str(caught.value)
    assert "the config's loss 'siglip' takes no negative set" in message and "\n" not in message
    assert ", ".join(set_losses()) in message and "siglip" not in set_losses()
    specs = NegativesStudy("smoke", config=path, loss="gcl", ns=[64], seeds=[0]).runs()
    assert {s.config["loss"]["name"] for s in specs} == {"gcl"}
    with pytest.raises(CrlValueError, match="`--loss` 'supcon' takes no negative set"):
        NegativesStudy("smoke", data="synthetic", loss="supcon")
