"""Training with the frozen bottom cached (``model.freeze_layers: k``): every transformer
encoder built with frozen layers takes its process's cache of the model and ``k``
(:func:`crl.models.frozen_cache.shared_outputs`), a run's summary equals the uncached run's to
float rounding, alone and in a group of runs that differ in their negatives
(:func:`crl.train.fit_group`), and the runs of one process compute each text once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_models_cli import _pairs

from crl.models import frozen_cache
from crl.models.frozen_cache import shared_outputs
from crl.train import fit, fit_group, validate_config

pytest.importorskip("transformers")

def _config(data: Path, tiny_bert: Path, m: int = 8, freeze: int = 1) -> Any:
    return validate_config({
        "data": {"name": "files", "num_train": 24,
                 "files": {"path": str(data), "columns": {"a": "q", "b": "d"}}},
        "model": {"kind": "transformer", "pretrained": str(tiny_bert), "freeze_layers": freeze,
                  "head": "linear", "embed_dim": 16},
        "loss": {"name": "clip"}, "negatives": {"regime": "independent", "m": m, "seed": 0},
        "train": {"batch_size": 8, "steps": 4, "num_threads": 1, "log_every": 1},
        "optim": {"lr": 1e-3}, "eval": {"probe": False, "ks": [1, 5]}}, origin="test")


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in summary.items() if isinstance(v, float) and not k.startswith("time/")}


def _uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("crl.models.transformer.is_supported", lambda model: False)


def test_encoders_take_the_process_cache(tiny_bert: Path) -> None:
    from crl.data.base import DataInfo
    from crl.models import build_model
    from crl.models.config import ModelConfig

    info = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                    name="texts")
    models = [build_model(ModelConfig(kind="transformer", pretrained=str(tiny_bert),
                                      freeze_layers=k, shared_tower=False), info)
              for k in (1, 1, 2)]
    caches = [t.backbone.frozen_outputs for m in models for t in (m.tower_a, m.tower_b)]
    one = shared_outputs((str(tiny_bert), 1))
    assert caches[:4] == [one] * 4 and caches[4] is caches[5] is not one
    free = build_model(ModelConfig(kind="transformer", pretrained=str(tiny_bert)), info)
    assert free.tower_a.backbone.frozen_outputs is None  # nothing frozen: nothing cached


@pytest.mark.parametrize("freeze", [1, 2])
def test_a_cached_run_equals_the_uncached_run(tmp_path: Path, tiny_bert: Path, freeze: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    data = _pairs(tmp_path / "pairs.jsonl", n=40)
    cfg = _config(data, tiny_bert, freeze=freeze)
    frozen_cache._SHARED.clear()
    cached = fit(cfg, tmp_path / "cached").summary
    outputs = shared_outputs((str(tiny_bert), freeze))
    texts = 2 * 40  # every distinct text of the train and test splits, once
    assert 0 < outputs.computed == len(outputs) <= texts
    computed = outputs.computed
    again = fit(cfg, tmp_path / "again").summary  # a second run of the process reuses them
    assert outputs.computed == computed and _numbers(again) == _numbers(cached)
    with monkeypatch.context() as patch:
        _uncached(patch)
        plain = fit(cfg, tmp_path / "plain").summary
    assert outputs.computed == computed
    assert _numbers(cached).keys() == _numbers(plain).keys()
    assert _numbers(cached) == pytest.approx(_numbers(plain), rel=1e-4, abs=1e-5)


def test_a_group_shares_the_cache_and_equals_lone_runs(tmp_path: Path, tiny_bert: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    data = _pairs(tmp_path / "pairs.jsonl", n=40)
    configs = [_config(data, tiny_bert, m=m) for m in (2, 8)]
    frozen_cache._SHARED.clear()
    grouped = fit_group(configs, [tmp_path / "g2", tmp_path / "g8"], batched=False)
    outputs = shared_outputs((str(tiny_bert), 1))
    assert outputs.computed == len(outputs)  # the group's copies of the model share it
    with monkeypatch.context() as patch:
        _uncached(patch)
        alone = [fit(c, tmp_path / f"a{i}").summary for i, c in enumerate(configs)]
    for group_run, lone in zip(grouped, alone, strict=True):
        assert _numbers(group_run.summary) == pytest.approx(_numbers(lone), rel=1e-4, abs=1e-5)
    assert _numbers(grouped[0].summary) != _numbers(grouped[1].summary)  # m mattered
