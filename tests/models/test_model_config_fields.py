"""``crl.models.config.KIND_FIELDS`` names the fields each model kind reads: every name is a
field of ``ModelConfig``, every field is read by some kind (or by all), and every kind but
``auto`` has an entry, so a new field or kind cannot be left out of the study's set-up words."""

from __future__ import annotations

from typing import get_args

from crl.models.config import COMMON_FIELDS, KIND_FIELDS, ModelConfig, ModelKind


def test_every_kind_field_is_a_model_field_and_every_field_is_read() -> None:
    fields = set(ModelConfig.model_fields)
    named = {name for names in KIND_FIELDS.values() for name in names}
    assert named <= fields, named - fields
    assert set(COMMON_FIELDS) <= fields
    assert fields == named | set(COMMON_FIELDS), fields - named - set(COMMON_FIELDS)
    assert set(KIND_FIELDS) == set(get_args(ModelKind)) - {"auto"}
