"""Every data set is declared once in ``crl.data.load.DATA_SETS``; ``prepare_data_caches`` knows
no data set: it fills whatever caches the declared hooks say, once per distinct section."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from crl.data import DataConfig, load
from crl.data.cache import prepare_data_caches


def test_every_data_set_name_is_declared() -> None:
    names = get_args(DataConfig.model_fields["name"].annotation)
    assert set(load.DATA_SETS) == set(names)
    assert [name for name, data in load.DATA_SETS.items() if data.cache is not None] == ["pycode"]


def test_prepare_data_caches_calls_each_declared_hook_once_per_distinct_section(
        monkeypatch: pytest.MonkeyPatch) -> None:
    filled: list[tuple[float, bool]] = []

    def fill(options: Any, progress: bool) -> None:
        filled.append((options.imbalance_ratio, progress))

    hook = load.CacheHook(lambda cfg: cfg.digits, fill)
    monkeypatch.setitem(load.DATA_SETS, "digits", load.DataSet(load.DATA_SETS["digits"].load,
                                                               hook))
    configs = [{"name": "digits"}, {"name": "digits", "seed": 3},
               DataConfig(name="digits", digits={"imbalance_ratio": 10}), {"name": "synthetic"}]
    assert prepare_data_caches(configs, progress=False) == 2
    assert filled == [(1.0, False), (10.0, False)]
