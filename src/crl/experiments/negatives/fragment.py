"""The recommendation as something to paste: a ``crl train`` config fragment (its
``negatives:`` and ``loss:`` sections) per regime, and the in-batch batch size the shared answer
corresponds to, with the memory gradient caching needs for it (:mod:`.memory`;
docs/negatives.md, "The answer as a config")."""

from __future__ import annotations

import math
from typing import Any

import yaml

from crl.experiments.negatives.laws import Recommendation
from crl.experiments.negatives.memory import MINILM_STEP, gradcache_memory, memory_text
from crl.experiments.negatives.text import m_text, pct
from crl.experiments.study import Section

#: Losses whose in-batch form contrasts each anchor with every other sample, not with the batch
#: (GCL's moving estimate ``u``: docs/negatives.md, "in_batch + GCL"), so a batch size does not
#: set their m; the in-batch answer trains InfoNCE at the same temperature instead.
ALL_SAMPLES_IN_BATCH = ("gcl",)


def _changed(value: Any, default: Any) -> Any:
    """The parts of ``value`` that differ from ``default`` (dicts compared key by key)."""
    if isinstance(value, dict) and isinstance(default, dict):
        return {k: _changed(v, default.get(k)) for k, v in value.items()
                if k not in default or v != default[k]}
    return value


def loss_section(loss: dict[str, Any]) -> dict[str, Any]:
    """The run's ``loss`` section as it differs from the defaults: its name, temperature, the
    options section named after it and every other key that was set (other losses' option
    sections left out).

    Example:
        >>> loss_section({"name": "gcl", "temperature": 0.05, "gcl": {"gamma": 0.5},
        ...               "oce": {"phi": "cvar"}, "symmetric": True})
        {'name': 'gcl', 'temperature': 0.05, 'gcl': {'gamma': 0.5}}
    """
    from crl.losses.config import LossConfig
    from crl.losses.registry import OBJECTIVES

    defaults = LossConfig().model_dump(mode="json")
    out: dict[str, Any] = {"name": loss["name"], "temperature": loss.get("temperature")}
    for key, value in loss.items():
        if key in out or (key in OBJECTIVES and key != loss["name"]):
            continue
        if key not in defaults or value != defaults[key]:
            changed = _changed(value, defaults.get(key))
            if changed != {}:  # an options section left at its defaults says nothing
                out[key] = changed
    return out


def _value(rec: Recommendation) -> tuple[float, str | None] | None:
    """The m to paste and which bound it is: the recommendation (None), the lower bound of a
    cell still rising (``"lower"``: more may help), or the upper bound of a cell already flat
    at its smallest m (``"upper"``: that many are enough); None without any."""
    if rec.m is not None and math.isfinite(rec.m):
        return rec.m, None
    if rec.low > 0 and math.isfinite(rec.low):
        return rec.low, "lower"
    if math.isfinite(rec.high):
        return rec.high, "upper"
    return None


#: What a bound means for the m pasted, completing "m = X (...)".
BOUND_WORDS = {"lower": "a lower bound: the curve still rises there, more may help",
               "upper": "an upper bound: the curve is already within the tolerance there, so "
                        "this many are enough"}


def fragment_yaml(sections: dict[str, Any]) -> str:
    """Config sections as block YAML, in their order."""
    return yaml.safe_dump(sections, sort_keys=False)


def config_fragment(rec: Recommendation, loss: dict[str, Any],
                    exclude_same_label: bool = False) -> dict[str, Any] | None:
    """The ``negatives:`` and ``loss:`` sections of ``rec`` (None without a value)."""
    found = _value(rec)
    if found is None:
        return None
    m = max(1, round(found[0]))
    negatives: dict[str, Any] = {"regime": rec.regime, "m": m}
    if exclude_same_label:
        negatives["exclude_same_label"] = True
    sections = {"negatives": negatives, "loss": loss_section(loss)}
    return {"regime": rec.regime, "m": m, "target_n": rec.target_n, "n_used": rec.n_used,
            "m_over_n": m / rec.target_n, "m_over_n_used": m / rec.n_used,
            "source": rec.source, "bound": found[1], **sections,
            "yaml": fragment_yaml(sections)}


def in_batch_fragment(shared: Recommendation, loss: dict[str, Any], dim: int | None,
                      model: dict[str, Any]) -> dict[str, Any] | None:
    """The in-batch batch size of the shared answer (``m + 1``: every other batch member is a
    negative, one shared set per step), its config sections with gradient caching, and the
    memory that needs (None without a shared value)."""
    found = _value(shared)
    if found is None:
        return None
    m = max(1, round(found[0]))
    section = loss_section(loss)
    swapped = section["name"] in ALL_SAMPLES_IN_BATCH
    if swapped:
        section = {"name": "info_nce", "temperature": section["temperature"]}
    memory = None if dim is None else gradcache_memory(m + 1, dim, model)
    # micro-batches of the measured size; a batch no larger takes one pass
    micro = MINILM_STEP.micro_batch_size if m + 1 > MINILM_STEP.micro_batch_size else None
    train = {"batch_size": m + 1} if micro is None else {"batch_size": m + 1,
                                                         "micro_batch_size": micro}
    sections = {"negatives": {"regime": "in_batch"}, "loss": section, "train": train}
    return {"batch_size": m + 1, "micro_batch_size": micro, "m": m, "bound": found[1],
            "loss_swapped": loss["name"] if swapped else None, **sections,
            "memory": None if memory is None else memory.to_dict(),
            "memory_text": "" if memory is None else memory_text(memory),
            "yaml": fragment_yaml(sections)}


def _lead(f: dict[str, Any]) -> str:
    measured = (", measured there by the verify stage" if f["source"] == "verify stage" else
                "" if f["n_used"] == f["target_n"] else
                f", measured at n = {f['n_used']:,}, where it is {pct(f['m'], f['n_used'])} of n")
    bound = f"; {BOUND_WORDS[f['bound']]}" if f["bound"] else ""
    return (f"{f['regime'].capitalize()} negatives at n = {f['target_n']:,}: m = "
            f"{m_text(f['m'])} ({pct(f['m'], f['target_n'])} of n{measured}){bound}.")


def _in_batch_lead(b: dict[str, Any]) -> str:
    swapped = (f" {b['loss_swapped']} with in-batch negatives contrasts each anchor with every "
               "other sample, not with the batch, so the in-batch answer trains info_nce at its "
               "temperature." if b["loss_swapped"] else "")
    caching = ("; it fits one pass" if b["micro_batch_size"] is None else
               f", with gradient caching (train.micro_batch_size {b['micro_batch_size']}) to "
               "bound the memory")
    bound = f" ({b['bound']} bound)" if b["bound"] else ""
    return (f"In-batch negatives (negatives.regime in_batch) are one shared set per step, every "
            f"other batch member: the shared answer's m = {m_text(b['m'])} per anchor{bound} is "
            f"train.batch_size {b['batch_size']:,}{caching}.{swapped}")


def answer_section(fragments: dict[str, dict[str, Any]], in_batch: dict[str, Any] | None,
                   training: str) -> Section:
    """The report's block to paste: each regime's sections, then the in-batch batch size and
    what gradient caching needs for it."""
    title = "The answer as a config"
    if not fragments:
        return Section(title, ["No regime's recommendation gives an m or a bound on it, so "
                               "there is nothing to paste."])
    paragraphs = [f"Paste one of these into your crl train config (it replaces its negatives: "
                  f"and loss: sections); each holds for the training it was measured at, "
                  f"{training}."]
    paragraphs += [_lead(f) for f in fragments.values()]
    code = [f["yaml"] for f in fragments.values()]
    if in_batch is None:
        paragraphs.append("The shared regime gives no m or bound, so there is no in-batch "
                          "batch size.")
    else:
        paragraphs.append(_in_batch_lead(in_batch))
        if in_batch["memory_text"]:
            paragraphs.append(in_batch["memory_text"])
        code.append(in_batch["yaml"])
    return Section(title, paragraphs, code=code)


def closing_text(fragments: dict[str, dict[str, Any]], in_batch: dict[str, Any] | None,
                 training: str) -> str:
    """What ``crl study negatives`` prints after its headline: the fragments as YAML documents
    (one per regime, then the in-batch one), every other line a YAML comment, so the whole
    text parses (``yaml.safe_load_all``) and each document pastes as it is."""
    if not fragments:
        return "# The answer as a config: no regime gives an m or a bound on it."
    docs = [f"# {_lead(f)}\n{f['yaml']}" for f in fragments.values()]
    if in_batch is not None:
        docs.append(f"# {_in_batch_lead(in_batch)}\n"
                    + (f"# {in_batch['memory_text']}\n" if in_batch["memory_text"] else "")
                    + in_batch["yaml"])
    head = (f"# The answer as a config, for your crl train YAML (it replaces the sections "
            f"shown; measured for {training}):\n")
    return head + "---\n".join(docs).rstrip("\n")
