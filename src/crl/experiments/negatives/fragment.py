"""The recommendation as something to paste: a ``crl train`` config fragment (its
``negatives:`` and ``loss:`` sections) and the in-batch batch size it corresponds to
(docs/negatives.md, "The answer as a config")."""

from __future__ import annotations

import math
from typing import Any

import yaml

from crl.experiments.negatives.laws import Recommendation


def loss_section(loss: dict[str, Any]) -> dict[str, Any]:
    """The part of a run's ``loss`` config that says which loss it is: its name, temperature
    and the options section named after it (``gcl: {gamma: ...}``), when there is one.

    Example:
        >>> loss_section({"name": "gcl", "temperature": 0.05, "gcl": {"gamma": 0.9},
        ...               "dcl": {"x": 1}})
        {'name': 'gcl', 'temperature': 0.05, 'gcl': {'gamma': 0.9}}
    """
    out = {"name": loss["name"], "temperature": loss.get("temperature")}
    if isinstance(loss.get(loss["name"]), dict):
        out[loss["name"]] = dict(loss[loss["name"]])
    return out


def config_fragment(rec: Recommendation, loss: dict[str, Any]) -> dict[str, Any] | None:
    """``{"negatives": ..., "loss": ..., "in_batch_size": ...}`` for ``rec`` (its value, or the
    lower bound of a censored cell; None without either)."""
    value = rec.m if rec.m is not None else rec.low if rec.low > 0 else None
    if value is None or not math.isfinite(value):
        return None
    m = max(1, round(value))
    return {"negatives": {"regime": rec.regime, "m": m}, "loss": loss_section(loss),
            "in_batch_size": m + 1, "bound": rec.m is None}


def fragment_yaml(fragment: dict[str, Any]) -> str:
    """The ``negatives:`` and ``loss:`` sections as block YAML (``analysis.json`` keeps it)."""
    return yaml.safe_dump({k: fragment[k] for k in ("negatives", "loss")}, sort_keys=False)


def fragment_text(fragment: dict[str, Any]) -> str:
    """The fragment in one sentence of flow-style YAML, with the in-batch batch size."""
    def flow(key: str) -> str:
        text = yaml.safe_dump({key: fragment[key]}, default_flow_style=True, sort_keys=False,
                              width=1000).strip()
        return text[1:-1]  # the outer braces of the one-key mapping
    regime = fragment["negatives"]["regime"]
    batch = (f"With in-batch negatives instead (negatives.regime in_batch), the same number of "
             f"negatives per anchor is train.batch_size: {fragment['in_batch_size']:,}."
             if regime == "shared" else
             "In-batch negatives are one shared set (the batch), so an independent set has no "
             "in-batch equivalent.")
    bound = " (a lower bound: the cell only bounds m*)" if fragment["bound"] else ""
    return (f"As a config{bound}, for your crl train YAML: {flow('negatives')}; "
            f"{flow('loss')}. {batch}")
