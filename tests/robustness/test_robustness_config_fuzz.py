"""Bad configs, generated from the schema: hypothesis draws a key of :class:`TrainConfig` (or an
unknown one) and gives it a wrong type, an invalid value or an unknown name. Each draw is either
a valid config or one :class:`CrlValueError` whose message names the key, never another exception;
the same through a YAML file, through ``--set`` and through ``crl train`` (exit code 2, one line).
"""

from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.train import TrainConfig, apply_overrides, load_config, validate_config

Path_ = tuple[str, ...]


def _walk(cls: type[BaseModel], prefix: Path_ = ()) -> tuple[list[Path_], list[Path_]]:
    """``(leaves, sections)`` of the config schema, as key paths."""
    leaves: list[Path_] = []
    sections: list[Path_] = [prefix]
    for name, field in cls.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            more_leaves, more_sections = _walk(annotation, (*prefix, name))
            leaves += more_leaves
            sections += more_sections
        else:
            leaves.append((*prefix, name))
    return leaves, sections


LEAVES, SECTIONS = _walk(TrainConfig)
BASE: dict[str, Any] = TrainConfig().model_dump(mode="json")

#: Values of every wrong kind: other types, non-finite and extreme numbers, odd strings.
BAD_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 10**30, -(10**30), 0.5, -0.5, math.nan, math.inf,
                     -math.inf, 1e308, "", " ", "abc", "ξ", "1e999", "nan", "[1, 2]", [], [1, "a"],
                     {}, {"x": 1}, [None], [[1]], ["cuda:x"]]),
    st.integers(), st.floats(), st.text(max_size=8),
    st.lists(st.one_of(st.integers(), st.floats(), st.text(max_size=3)), max_size=3),
)
UNKNOWN = st.text(string.ascii_lowercase + "_", min_size=1, max_size=10)


def _set(data: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


def _fresh() -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(BASE))  # a deep copy


def _check(data: dict[str, Any], key: str) -> str | None:
    """The error message for ``data`` (None when it is a valid config); it must name ``key``."""
    try:
        validate_config(data, "fuzz")
    except CrlValueError as exc:
        message = str(exc)
        assert f"  {key}" in message or f"  {key}." in message, (key, message)
        return message
    return None


def test_the_schema_is_walked() -> None:
    assert len(LEAVES) > 80 and ("loss", "gcl", "gamma") in LEAVES and ("data", "files") in SECTIONS


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(LEAVES), BAD_VALUES)
def test_a_bad_value_is_one_error_naming_its_key(path: Path_, value: Any) -> None:
    _check(_set(_fresh(), path, value), ".".join(path))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SECTIONS), UNKNOWN, BAD_VALUES)
def test_an_unknown_key_is_one_error_naming_it(section: Path_, name: str, value: Any) -> None:
    node: Any = BASE
    for part in section:
        node = node[part]
    if name in node:
        return
    key = ".".join((*section, name))
    message = _check(_set(_fresh(), (*section, name), value), key)
    assert message is not None and f"{key}: unknown key; valid keys here: " in message


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([s for s in SECTIONS if s]), BAD_VALUES.filter(lambda v: v != {}))
def test_a_section_of_the_wrong_type_is_one_error(section: Path_, value: Any) -> None:
    assert _check(_set(_fresh(), section, value), ".".join(section)) is not None


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(LEAVES), st.text(max_size=12))
def test_a_set_override_is_a_config_or_one_error(path: Path_, raw: str) -> None:
    key = ".".join(path)
    try:
        data = apply_overrides(_fresh(), [f"{key}={raw}"])
    except CrlValueError as exc:
        assert "--set" in str(exc)
        return
    _check(data, key)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(LEAVES), BAD_VALUES)
def test_a_yaml_file_is_a_config_or_one_error(tmp_path: Path, path: Path_, value: Any) -> None:
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump(_set(_fresh(), path, value)), encoding="utf-8")
    key = ".".join(path)
    try:
        load_config(str(file))
    except CrlValueError as exc:
        assert f"  {key}" in str(exc), (key, str(exc))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(LEAVES), BAD_VALUES)
def test_crl_train_rejects_a_bad_config_with_one_line(path: Path_, value: Any) -> None:
    key = ".".join(path)
    raw = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    data = apply_overrides(_fresh(), [f"{key}={raw}"])
    if _check(data, key) is None:
        return  # a valid config would train: not this test's business
    result = CliRunner().invoke(app, ["train", "synthetic-gaussian", "--set", f"{key}={raw}",
                                      "--out", "/nonexistent/never-written"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], result.output


def test_validate_config_reports_every_problem_together() -> None:
    data = _set(_set(_fresh(), ("train", "steps"), "ten"), ("loss", "temperature"), -1)
    with pytest.raises(CrlValueError, match="2 error") as info:
        validate_config(data)
    assert "train.steps" in str(info.value) and "loss.temperature" in str(info.value)


@pytest.mark.parametrize(("data", "key"), [
    ({"eval": {"hard_negatives": True}}, "eval.hard_negatives"),  # a truthy fuzz value, too
    ({"train": {"micro_batch_tokens": 100}}, "train.micro_batch_tokens"),
])
def test_a_check_across_sections_is_shown_at_the_key_it_names(data: dict[str, Any],
                                                              key: str) -> None:
    message = _check(data, key)
    assert message is not None and "(top level)" not in message
    assert f"  {key}: {key}:" not in message  # the key once at the start of its line
