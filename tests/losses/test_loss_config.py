"""The ``loss`` section loads no loss, and a loss name is checked against the registry where it
is looked up; ``crl.losses`` imports its names on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import crl.losses
from crl.errors import CrlValueError
from crl.losses.config import LossConfig
from crl.losses.registry import OBJECTIVES, loss_class
from crl.negatives import NegativesConfig


def test_importing_the_loss_config_imports_no_loss() -> None:
    code = ("import sys, crl.losses.config; LossConfig = crl.losses.config.LossConfig; "
            "LossConfig(name='gcl', block_size='plain'); "
            "print(sorted(m for m in sys.modules if m.startswith('crl.losses.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "['crl.losses.config']"


def test_a_name_outside_the_registry_is_refused_with_the_valid_ones() -> None:
    assert loss_class("gcl") is OBJECTIVES["gcl"]
    valid = ", ".join(repr(name) for name in OBJECTIVES)
    with pytest.raises(CrlValueError, match=f"{valid}; got 'infonce'"):
        loss_class("infonce")
    unchecked = LossConfig.model_construct(name="infonce")  # skips the config's own check
    with pytest.raises(CrlValueError, match=r"loss\.name must be one of the registered losses"):
        crl.losses.build_objective(unchecked, NegativesConfig(), num_samples=4)


def test_every_public_name_resolves_on_first_use() -> None:
    import crl.losses.functional as functional

    for name in crl.losses.__all__:
        assert getattr(crl.losses, name) is not None, name
    assert set(crl.losses.__all__) <= set(dir(crl.losses))
    for name in functional.__all__:  # one object, two addresses
        assert getattr(crl.losses, name) is getattr(functional, name), name
    with pytest.raises(AttributeError, match="no attribute 'info_nse'"):
        _ = crl.losses.info_nse  # type: ignore[attr-defined]
