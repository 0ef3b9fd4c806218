"""The negatives study's data check (once, before any worker) and its set-up section, written
in sentences and tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crl.errors import CrlValueError
from crl.experiments.metrics import metric_value
from crl.experiments.negatives.grid import DATA_WORDS, GRID_FLAGS, Grid, grid_changes
from crl.experiments.negatives.setup_model import model_text
from crl.experiments.negatives.userdata import span_text
from crl.experiments.study import Section, Table

if TYPE_CHECKING:
    from crl.experiments.negatives.study import NegativesStudy

DATA_FILE = "data.json"
#: The baseline's words when ``data.json`` names none (studies written before it did).
UNTRAINED = "the untrained model"
#: Model kinds over a pretrained backbone, and what their model before training is: the
#: frozen or zero-shot baseline every run starts from.
PRETRAINED = {
    "frozen_minilm": "frozen MiniLM features through the untrained head",
    "transformer": "the pretrained encoder before fine-tuning (zero-shot)",
}


def check_data(config: dict[str, Any], ns: Sequence[int], metric: str = "recall@1"
               ) -> dict[str, Any]:
    """Load the data of a run ``config`` once, check that its model takes it and that every n
    fits in the training split; returns its sizes (and, for a pretrained backbone, ``metric``
    of the model before training on the test split: ``baseline`` with ``baseline_label``)."""
    from crl.data import load_data
    from crl.models.build import resolve_kind
    from crl.train import validate_config

    cfg = validate_config(config, origin="study negatives")
    try:
        splits = load_data(cfg.data.model_copy(update={"num_train": None}), progress=False)
    except FileNotFoundError as exc:
        raise CrlValueError(f"study negatives: {exc}") from None
    kind = resolve_kind(cfg.model, splits.info)
    train = len(splits.train)
    facts: dict[str, Any] = {"data": splits.info.name, "data_kind": splits.info.kind,
                             "model_kind": kind, "train_size": train,
                             "test_size": len(splits.test), "baseline": None}
    check_ns(ns, facts)
    if kind in PRETRAINED:
        facts["baseline"] = _untrained_metric(cfg, metric)
        facts["baseline_label"] = PRETRAINED[kind]
    if kind == "transformer":
        from crl.models.transformer import describe_pretrained, pretrained_text

        facts["pretrained"] = describe_pretrained(cfg.model)
        facts["frozen"] = pretrained_text(facts["pretrained"])  # the set-up's "Frozen:" words
    return facts


def check_ns(ns: Sequence[int], facts: dict[str, Any]) -> None:
    """Every n fits in the training split of the data ``facts`` describe (:func:`check_data`).

    Raises:
        CrlValueError: naming the n that do not, and the split's size.
    """
    train = facts["train_size"]
    too_big = [n for n in ns if n > train]
    if too_big:
        raise CrlValueError(f"study negatives: n = {too_big} exceed the {train:,} training pairs "
                            f"of {facts['data']!r}; choose --ns of at most {train}")


def _untrained_metric(cfg: Any, metric: str) -> float | None:
    """``metric`` of the model before training on the test split (``recall@1``: the mean of
    both directions); None when the evaluation does not produce it."""
    import torch

    from crl.train import build_run
    from crl.train.evaluation import evaluate

    built = build_run(cfg, torch.device("cpu"))
    if built.test_ds is None:
        return None
    built.model.eval()
    with torch.no_grad():
        metrics = evaluate(built.model, built.test_ds, cfg.eval.model_copy(
            update={"probe": False, "geometry": False, "risk": False}),
            temperature=cfg.loss.temperature)
    return metric_value(metrics, metric)


def baseline_label(data: dict[str, Any]) -> str:
    """What the baseline of a study's ``data.json`` is, in words."""
    return str(data.get("baseline_label", UNTRAINED))


def _values(grid: Grid, name: str) -> str:
    value = getattr(grid, name)
    if isinstance(value, tuple):
        return ", ".join(f"{v:,}" if isinstance(v, int) else f"{v:g}" for v in value)
    return "none" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:g}"


def grid_text(study: NegativesStudy, data: dict[str, Any]) -> str:
    """Where the grid comes from: the preset's (fitted to a small file, with the numbers), or a
    custom grid naming what replaced the preset's."""
    preset, default = study.preset, study.chosen_grid
    changed = grid_changes(default, study.preset_grid)
    if changed:
        text = (f"The grid is custom: {', '.join(GRID_FLAGS[c] for c in changed)} replace the "
                f"{preset} preset's "
                + "; ".join(f"{c.replace('_', ' ')} ({_values(default, c)})" for c in changed)
                + ".")
    else:
        text = (f"The grid is the {preset} preset's for {DATA_WORDS.get(study.kind, study.kind)}"
                + (" (the pycode preset's: the same n, m/n, seeds, budget and refinement)"
                   if study.kind == "files" and preset != "smoke" else "")
                + (f", with {default.refine_runs:,} refinement runs at most."
                   if default.refine_runs else ", without refinement runs."))
    if data.get("fitted_ns"):
        text += " " + span_text(preset, data["preset_ns"], data["fitted_ns"],
                                data["train_size"])
    return text


def _pretrained_lines(data: dict[str, Any], grid_rule: str | None) -> list[str]:
    """The pretrained model and what was frozen (``data.json``'s ``pretrained``), and why the
    preset's grid is not the data set's."""
    from crl.models.transformer import pretrained_text

    found = data.get("pretrained")
    parts = [pretrained_text(found)] if isinstance(found, dict) else []
    text = " ".join(parts + ([grid_rule] if grid_rule else []))
    return [text] if text else []


def setup_section(study: NegativesStudy, data: dict[str, Any], distinct: int) -> Section:
    """The set-up: data, model, loss, budget and the grid, in sentences and a table."""
    g = study.grid
    first = study.runs()[0].config
    source = ("the user's config " + str(study.options["config"]) if study.base is not None
              else f"data {study.options['data']}")
    model = first["model"]
    kind = str(data.get("model_kind") or model.get("kind"))
    sizes = (f" The training split holds {data['train_size']:,} pairs; every run is evaluated "
             f"on the same {data['test_size']:,} held-out test pairs."
             if data.get("train_size") else "")
    if study.target_n is not None:
        sizes += f" The answer is for the n given, --target-n {study.target_n:,}."
    elif data.get("target_source"):
        sizes += (f" The answer is for n = {data['user_train_size']:,}, {data['target_source']} "
                  "(--target-n sets another).")
    loss = first["loss"]
    scale = (" with its learnt logit scale" if loss["name"] == "clip" else
             " with its learnt scale and bias" if loss["name"] == "siglip" else
             f" at temperature {loss.get('temperature')}")
    paragraphs = [
        f"Sweep of {source}: data set {data.get('data', first['data']['name'])!r} "
        f"({data.get('data_kind', 'see the config')}); {model_text(model, kind)}." + sizes,
        *([f"Frozen: {data['frozen']}."] if data.get("frozen") else []),
        f"Every run trains with the loss {loss['name']!r}{scale} and the "
        f"{first['optim']['name']} optimiser (learning rate {first['optim']['lr']:g}) at batch "
        f"size {g.batch_size} for {g.training_text()}, so m is independent of the batch (but "
        "the k = B m / n of an anchor's negatives that one batch holds is not: see the table). "
        "Both regimes are swept: shared (one negative set for all anchors, the CLIP setting) "
        "and independent (each anchor its own set); with m >= n - 1 every other anchor is a "
        "negative and one run serves both.",
        grid_text(study, data),
        ("Under the fixed budget, smaller n means more epochs over the same anchors (see the "
         "table): a difference between values of n mixes more anchors with fewer passes over "
         "each, so m*(n) describes this budget; comparisons between m at one n share n, seed "
         "and epochs and are not affected." if g.target_epochs is None else
         "Every n trains the same number of epochs, so a larger n processes more samples (see "
         "the table); comparisons between m at one n share n, seed and epochs."),
        f"Distinct runs trained: {distinct} (the refinement's included).",
        *_pretrained_lines(data, study.grid_rule),
    ]
    if data.get("baseline") is None:
        paragraphs.append("The model has no pretrained backbone, so there is no zero-shot "
                          "baseline: an untrained model is at chance.")
    else:
        paragraphs.append(f"Baseline: {baseline_label(data)} "
                          f"scores {study.metric} = {data['baseline']:.3f} on the same test "
                          "pairs; the curves draw it as a dashed line.")
    rows = [[n, g.steps(n), g.epochs(n), g.steps(n) * min(g.batch_size, n) / n,
             ", ".join(f"{max(1, round(f * n)):,} ({100 * f:g}%)" for f in g.fractions),
             ", ".join(f"{g.negatives_per_step(n, max(1, round(f * n))):.3g}"
                       for f in g.fractions),
             ", ".join(map(str, g.seeds))] for n in g.ns]
    table = Table("The grid: anchors n, steps and epochs under the budget, m swept (% of n), "
                  "negatives per step, seeds",
                  ["n", "steps", "epochs (the runs' epoch column: steps / floor(n / B))",
                   "samples per anchor (steps B / n)", "m swept (% of n)",
                   "negatives per step k = B m / n", "seeds"], rows)
    return Section("Set-up", paragraphs, tables=[table])
