"""Loading a run config: a YAML file or a shipped preset, ``--set`` overrides, validation that
reports every problem together, and the ``--smoke`` shrink.

Example:
    >>> cfg = load_config("synthetic-gaussian", ["train.steps=50", "loss.temperature=0.2"])
    >>> cfg.train.steps, cfg.loss.temperature, cfg.train.total_steps(num_train=100)
    (50, 0.2, 50)
"""

from __future__ import annotations

import email
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from crl._validation import clip_text, describe
from crl._yaml import YamlLimitError, load_yaml
from crl.errors import CrlValueError
from crl.train.config import TrainConfig


def preset_names() -> list[str]:
    """Names of the shipped presets (``crl train <name>``)."""
    folder = resources.files("crl.train") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _read_source(path_or_preset: str | Path) -> tuple[dict[str, Any], str]:
    path = Path(path_or_preset)
    if path.is_file():
        text, origin = path.read_text(encoding="utf-8"), str(path)
    elif str(path_or_preset) in preset_names():
        resource = resources.files("crl.train") / "presets" / f"{path_or_preset}.yaml"
        text, origin = resource.read_text(encoding="utf-8"), f"preset {path_or_preset!r}"
    else:
        raise CrlValueError(
            f"load_config: CONFIG must be a YAML file or a preset name; got {str(path_or_preset)!r}"
            f" (no such file; presets: {', '.join(preset_names())})"
        )
    data = load_yaml(text, origin)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CrlValueError(f"{origin}: the top level must be a mapping of sections; "
                            f"got {type(data).__name__}")
    return data, origin


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``--set a.b=c`` overrides to a nested dict (values parsed as YAML scalars).

    Example:
        >>> apply_overrides({"train": {"steps": 10}}, ["train.steps=20", "loss.name=clip"])
        {'train': {'steps': 20}, 'loss': {'name': 'clip'}}
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise CrlValueError(f"--set: expected KEY=VALUE with a dotted KEY such as "
                                f"train.steps=100; got {item!r}")
        try:
            value = load_yaml(raw, f"--set {describe(item)}") if raw.strip() else None
        except YamlLimitError:
            raise
        except CrlValueError:  # not YAML: the text itself
            value = raw
        node = data
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CrlValueError(f"--set {describe(item)}: {'.'.join(parts[:depth + 1])} is "
                                    f"a value, not a section; got {describe(child)}")
            node = child
        node[parts[-1]] = value
    return data


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The config class at a location, to list its valid keys."""
    cls: type[BaseModel] = TrainConfig
    for part in loc:
        field = cls.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return cls


#: The most errors of a config listed in its message (the count says how many there are).
_MAX_LISTED = 20


def format_validation_error(exc: ValidationError, origin: str) -> str:
    """All errors of a config, one line each (the first :data:`_MAX_LISTED`), naming the dotted
    key; a value is quoted in at most 60 characters."""
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            valid = ", ".join(parent.model_fields) if parent is not None else "?"
            lines.append(f"  {key}: unknown key; valid keys here: {valid}")
        else:
            message = clip_text(err["msg"].removeprefix("Value error, "))
            got = err.get("input")
            shown = "" if isinstance(got, dict) else f"; got {describe(got)}"
            # A section's own check ("ks must be ...") is shown at the key it names: eval.ks;
            # so is a check across sections that names its dotted key ("eval.hard_negatives
            # needs ...", "train.micro_batch_tokens: ...").
            named = message.split(" ", 1)[0].rstrip(":").split(".")
            section = _model_at([*loc, *named[:-1]])
            if section is not None and named[-1] in section.model_fields:
                key = ".".join([*(str(p) for p in loc), *named])
                message = message.removeprefix(".".join(named) + ": ")
            lines.append(f"  {key}: {message}{shown}")
    shown_lines = lines[:_MAX_LISTED] + ([f"  ... and {len(lines) - _MAX_LISTED} more"]
                                         if len(lines) > _MAX_LISTED else [])
    return f"{origin}: {len(lines)} error(s) in the config:\n" + "\n".join(shown_lines)


#: The largest integer torch and numpy take (sizes, seeds, steps): ``2**63 - 1``.
_INT64_MAX = 2**63 - 1


def _oversized_ints(value: Any, key: str = "") -> list[str]:
    """One line for every integer of a config beyond 64 bits (torch cannot hold it)."""
    if isinstance(value, dict):
        return [line for k, v in value.items()
                for line in _oversized_ints(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, (list, tuple)):
        return [line for i, v in enumerate(value) for line in _oversized_ints(v, f"{key}.{i}")]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT64_MAX:
        return [f"  {key}: must fit in 64 bits (at most 2**63 - 1 in size); got {describe(value)}"]
    return []


def validate_config(data: dict[str, Any], origin: str = "config") -> TrainConfig:
    """Validate a nested dict into a :class:`TrainConfig`, reporting every error together."""
    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise CrlValueError(format_validation_error(exc, origin)) from None
    lines = _oversized_ints(config.model_dump())
    if lines:
        raise CrlValueError(f"{origin}: {len(lines)} error(s) in the config:\n" + "\n".join(lines))
    return config


def load_config(path_or_preset: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Load a run config from a YAML file or a shipped preset, then apply ``--set`` overrides.

    Args:
        path_or_preset: A YAML file, or a preset name (see :func:`preset_names`).
        overrides: ``"a.b=c"`` strings; values are parsed as YAML scalars (``1e-3``, ``true``,
            ``[1, 5]``, ``null``).

    Returns:
        The validated config.

    Raises:
        CrlValueError: listing every problem (unknown keys with the valid ones, bad values).
    """
    data, origin = _read_source(path_or_preset)
    return validate_config(apply_overrides(data, overrides), origin)


def smoke(config: TrainConfig) -> TrainConfig:
    """A copy of ``config`` shrunk to run in seconds: 20 steps of batches of at most 32, at most
    256 training pairs (digits, synthetic), and (pycode) only the standard library's ``email``
    package mined.

    Example:
        >>> smoke(load_config("digits-simclr")).train.steps
        20
    """
    data = config.model_dump()
    train = data["train"]
    batch = min(config.train.batch_size, 32)
    train.update(batch_size=batch, steps=20, epochs=None, max_samples=None, log_every=5,
                 eval_every=10, checkpoint_every=10)
    data["optim"]["warmup_steps"] = min(config.optim.warmup_steps, 5)
    if config.data.name in ("digits", "synthetic"):  # sizes known to exceed 256
        data["data"]["num_train"] = min(config.data.num_train or 256, 256)
    data["data"]["synthetic"]["num_samples"] = min(config.data.synthetic.num_samples, 512)
    data["eval"]["batch_size"] = min(config.eval.batch_size, 256)
    if config.data.name == "pycode" and config.data.pycode.roots is None:
        # Mine one small standard-library package instead of the whole installation.
        data["data"]["pycode"]["roots"] = [str(Path(email.__file__).parent)]
    if config.loss.gcl.decay_epochs is not None:
        data["loss"]["gcl"]["decay_epochs"] = 1
    return validate_config(data, "smoke config")


__all__ = [
    "apply_overrides",
    "format_validation_error",
    "load_config",
    "preset_names",
    "smoke",
    "validate_config",
]
