"""One entry of the MiniLM fine-tuning comparison, in this process alone (for a clean peak RSS).

On pycode's fixed split (``data.name: pycode``, default fractions and seeds), all-MiniLM-L6-v2
(max sequence length 128, float32) is fine-tuned for one pass over the first ``--train-pairs``
pairs of the seeded training order (``data.num_train``, the same pairs for every entry), then the
first ``--test-pairs`` pairs of the test split are embedded and scored (recall@1 docstring ->
code and code -> docstring, among those pairs):

- ``frozen``: the model as shipped;
- ``sentence_transformers``: its own recipe, ``MultipleNegativesRankingLoss`` (scale 20, cosine),
  batch 64, lr 2e-5, 10% linear warm-up then linear decay, ``NO_DUPLICATES`` batches;
- ``crl_clip_b64``: ``crl``'s trainer (``model.kind: transformer``), the CLIP loss with its
  learnable scale, batch 64, lr 2e-5, 10% warm-up then cosine decay, no-duplicates sampler. The
  run is stopped (``fit(stop_at=)``, with its checkpoint) after the pass, one step before a
  budget of pass + 1 steps, so that crl's own evaluation of the whole val and test splits is
  skipped; the checkpoint is then scored on the same test pairs as the others;
- ``crl_gcl_b16``: the same with GCL (fixed temperature 0.05) at batch 16;
- ``crl_clip_b16`` (optional, not in the default entries): the CLIP loss at batch 16, which
  separates the effect of the batch size from that of the loss;
- ``crl_gcl_b16_tau07`` (optional): GCL at batch 16 at temperature 0.07, the temperature the
  CLIP loss trains at (its learnable scale starts at 1/0.07 and barely moves at lr 2e-5);
- ``crl_gcl_pos_b16`` (optional): GCL at batch 16 with ``loss.gcl.include_positive: true`` (the
  InfoNCE form; on a first visit, InfoNCE's gradient), temperature 0.05;
- ``crl_clip_b64_matryoshka`` (optional): ``crl_clip_b64`` with ``loss.matryoshka`` at
  :data:`MATRYOSHKA_DIMS` (weights 1), sentence-transformers' usual prefixes of a 384-dim model;
- ``crl_clip_b16_mined`` (optional): ``crl_clip_b16`` trained on the same pairs, in the same
  order, each with one hard negative mined by frozen MiniLM (``crl.mine.mine_hard_negatives``,
  :data:`MINING`: the 50 best-scoring positives of the other training pairs, those scored
  above 95% of the pair's own positive dropped, the best left kept; sentence-transformers'
  ``mine_hard_negatives(range_max=50, relative_margin=0.05, num_negatives=1)``); a pair
  without one is left out, and the mining time is reported apart (``mining``);
- ``crl_clip_b16_guide`` (optional): ``crl_clip_b16`` with ``loss.guide`` (frozen MiniLM,
  :data:`GUIDE`: absolute margin 0, ``GISTEmbedLoss``'s default: an in-batch negative the
  guide scores above the pair's positive is masked);
- ``crl_clip_b16_matryoshka`` (optional): ``crl_clip_b16`` with ``loss.matryoshka`` at
  :data:`MATRYOSHKA_DIMS`.

Every crl entry also reports ``prefix_metrics``: the retrieval metrics of the first ``d``
coordinates (renormalised) for each ``d`` of :data:`MATRYOSHKA_DIMS`, so the Matryoshka entry
and the plain one compare at each prefix.

Prints one JSON line. Driven by ``benchmarks/quality.py --minilm``; alone:

    .venv/bin/python benchmarks/quality_minilm.py frozen --train-pairs 2560 --test-pairs 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from crl.bench._measure import GIB, current_rss, machine_state, peak_rss
from crl.data import load_data
from crl.data.base import TextPairDataset
from crl.data.config import DataConfig
from crl.eval import retrieval_metrics, retrieval_ranks
from crl.eval.prefixes import prefix_retrieval_metrics
from crl.models.text import minilm_model_dir

ENTRIES = ("frozen", "sentence_transformers", "crl_clip_b64", "crl_gcl_b16", "crl_clip_b16",
           "crl_gcl_b16_tau07", "crl_gcl_pos_b16", "crl_clip_b64_matryoshka",
           "crl_clip_b16_mined", "crl_clip_b16_guide", "crl_clip_b16_matryoshka")
MATRYOSHKA_DIMS = (384, 256, 128, 64)
#: ``crl_clip_b16_mined``'s mining options (``crl.mine.MiningOptions``).
MINING = {"num_negatives": 1, "range_max": 50, "relative_margin": 0.05}
#: ``crl_clip_b16_guide``'s ``loss.guide`` section.
GUIDE = {"model": "minilm", "margin": 0.0, "margin_strategy": "absolute"}
MAX_SEQ_LENGTH = 128
LR = 2e-5
WARMUP = 0.1
KS = (1, 5, 10)


def _splits(train_pairs: int, test_pairs: int) -> tuple[Any, TextPairDataset]:
    """The training subset and the first ``test_pairs`` test pairs of pycode's fixed split."""
    splits = load_data(DataConfig(name="pycode", num_train=train_pairs), progress=False)
    test = TextPairDataset(splits.test.a[:test_pairs], splits.test.b[:test_pairs])
    return splits.train, test


def _st_model() -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    model.max_seq_length = MAX_SEQ_LENGTH
    return model


def hits_at_1(za: torch.Tensor, zb: torch.Tensor) -> dict[str, str]:
    """Per test pair, whether its positive ranks first (``crl.eval.retrieval_ranks``, ties
    against the positive): ``"x2y"`` and ``"y2x"`` as strings of ``0``/``1``, so that entries
    can be compared pair by pair."""
    return {key: "".join("1" if r == 1 else "0" for r in ranks.tolist())
            for key, ranks in retrieval_ranks(za, zb).items()}


def _scored(za: torch.Tensor, zb: torch.Tensor) -> tuple[dict[str, float], dict[str, str]]:
    """``retrieval_metrics`` and :func:`hits_at_1` of one entry's test embeddings."""
    return retrieval_metrics(za, zb, ks=list(KS)), hits_at_1(za, zb)


def _st_scores(model: Any, test: Any) -> tuple[dict[str, float], dict[str, str]]:
    """Embed the test split with the model (its own Normalize layer: cosine) and score it."""
    model.eval()
    with torch.no_grad():
        za = model.encode(test.a, batch_size=64, convert_to_tensor=True, show_progress_bar=False)
        zb = model.encode(test.b, batch_size=64, convert_to_tensor=True, show_progress_bar=False)
    return _scored(za.float(), zb.float())


def frozen(train_pairs: int, test_pairs: int) -> dict[str, Any]:
    _, test = _splits(train_pairs, test_pairs)
    model = _st_model()
    wall = time.perf_counter()
    scores, hits = _st_scores(model, test)
    return {"train_seconds": 0.0, "steps": 0, "eval_seconds": time.perf_counter() - wall,
            "num_test": len(test), "metrics": scores, "hits@1": hits}


def sentence_transformers(train_pairs: int, test_pairs: int) -> dict[str, Any]:
    """sentence-transformers' recipe with its own trainer and loss."""
    import datasets
    import pyarrow as pa
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    train_split, test = _splits(train_pairs, test_pairs)
    model = _st_model()
    # From an Arrow table: Dataset.from_dict fingerprints by pickling, which failed here.
    train = datasets.Dataset(pa.table({"anchor": train_split.a, "positive": train_split.b}))
    with tempfile.TemporaryDirectory(prefix="crl-st-") as out:
        args = SentenceTransformerTrainingArguments(
            output_dir=out, num_train_epochs=1, per_device_train_batch_size=64,
            learning_rate=LR, warmup_steps=WARMUP, batch_sampler=BatchSamplers.NO_DUPLICATES,
            seed=0, report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
            logging_steps=10)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                             loss=MultipleNegativesRankingLoss(model))
        wall = time.perf_counter()
        result = trainer.train()
        train_seconds = time.perf_counter() - wall
    wall = time.perf_counter()
    scores, hits = _st_scores(model, test)
    return {"train_seconds": train_seconds, "steps": result.global_step,
            "train_loss": result.training_loss, "eval_seconds": time.perf_counter() - wall,
            "num_test": len(test), "metrics": scores, "hits@1": hits}


def crl_config(loss: str, batch: int, train_pairs: int, temperature: float = 0.05,
               include_positive: bool = False, matryoshka: bool = False,
               guide: bool = False, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The crl run config of an entry (written to YAML and read by ``crl.train.load_config``);
    ``temperature`` and ``include_positive`` are GCL's (the CLIP loss learns its scale from
    1/0.07); ``matryoshka``: ``loss.matryoshka`` at :data:`MATRYOSHKA_DIMS`; ``guide``:
    ``loss.guide`` as :data:`GUIDE`; ``data``: the data section (None: pycode's first
    ``train_pairs``)."""
    steps = train_pairs // batch
    loss_section: dict[str, Any] = ({"name": "clip"} if loss == "clip" else
                                    {"name": "gcl", "temperature": temperature,
                                     "symmetric": True})
    if include_positive:
        loss_section["gcl"] = {"include_positive": True}
    if matryoshka:
        loss_section["matryoshka"] = {"dims": list(MATRYOSHKA_DIMS)}
    if guide:
        loss_section["guide"] = dict(GUIDE)
    return {
        "data": data or {"name": "pycode", "num_train": train_pairs},
        "model": {"kind": "transformer", "max_seq_length": MAX_SEQ_LENGTH, "pooling": "mean"},
        "loss": loss_section,
        "optim": {"name": "adamw", "lr": LR, "weight_decay": 0.0,
                  "warmup_steps": max(1, round(WARMUP * steps))},
        # steps + 1: fit(stop_at=steps) then stops before crl's whole-split evaluation
        "train": {"seed": 0, "batch_size": batch, "steps": steps + 1,
                  "sampler": "no_duplicates", "log_every": 10},
        "eval": {"probe": False, "geometry": False, "risk": False, "batch_size": 64},
    }


def mined_pairs(train: Any, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``train``'s pairs with one hard negative each, mined by frozen MiniLM with
    :data:`MINING`, written to ``folder/mined.jsonl`` (columns ``a``, ``b``, ``negative_1``)
    so that crl reads them back as its training split in ``train``'s order: ``data.name:
    files`` puts row ``P[i]`` of the file ``i``-th, ``P`` being its seeded training order of
    that many rows, so pair ``i`` is written to row ``P[i]``. Pairs without a negative are
    left out (the others keep their order). Returns the data section and what the mining
    did (its time, its options, the pairs kept)."""
    import numpy as np

    from crl.data.splits import train_order
    from crl.eval.encoder import load_encoder
    from crl.mine import MiningOptions, mine_hard_negatives

    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="crl-mine-cache-") as cache:  # time the encoding
        mined = mine_hard_negatives(train.a, train.b, load_encoder("minilm", cache_dir=cache),
                                    options=MiningOptions(**MINING))
    seconds = time.perf_counter() - wall
    kept = [i for i, negs in enumerate(mined.negatives) if negs is not None]
    order = train_order(np.arange(len(kept)), 0, None)
    rows: list[str] = [""] * len(kept)
    for i, row in zip(kept, order.tolist(), strict=True):
        negs = mined.negatives[i]
        assert negs is not None
        rows[row] = json.dumps({"a": train.a[i], "b": train.b[i], "negative_1": negs[0]})
    (folder / "mined.jsonl").write_text("\n".join(rows) + "\n")
    # crl needs a validation and a test file; the run stops before evaluating either
    (folder / "held.jsonl").write_text("\n".join(rows[:64]) + "\n")
    scores = mined.scores[:, 0][~mined.scores[:, 0].isnan()]
    report = {"seconds": seconds, "options": MINING, "model": "minilm (frozen, 256 tokens)",
              "corpus_size": mined.corpus_size, "pairs_in": len(train), "pairs_kept": len(kept),
              "skipped": mined.skipped, "negative_score_mean": float(scores.mean()),
              "positive_score_mean": float(mined.positive_scores.mean())}
    files = {"path": str(folder / "mined.jsonl"), "val_path": str(folder / "held.jsonl"),
             "test_path": str(folder / "held.jsonl"),
             "columns": {"a": "a", "b": "b", "negatives": ["negative_1"]}}
    return {"name": "files", "files": files}, report


def crl_entry(loss: str, batch: int, train_pairs: int, test_pairs: int,
              temperature: float = 0.05, include_positive: bool = False,
              matryoshka: bool = False, guide: bool = False,
              mined: bool = False) -> dict[str, Any]:
    """crl's own trainer, fine-tuning the transformer end to end; then its checkpoint scored.
    ``mined``: on :func:`mined_pairs` of the same training pairs."""
    import yaml

    from crl.rundir import CHECKPOINT_FILE
    from crl.train import build_run, config_hash, fit, load_config
    from crl.train.checkpoint import load_checkpoint
    from crl.train.evaluation import encode_split

    train, test = _splits(train_pairs, test_pairs)
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="crl-quality-") as tmp:
        data = None
        if mined:
            data, extra["mining"] = mined_pairs(train, Path(tmp))
            train_pairs = extra["mining"]["pairs_kept"]
        steps = train_pairs // batch
        path = Path(tmp) / "config.yaml"
        config = crl_config(loss, batch, train_pairs, temperature, include_positive, matryoshka,
                            guide, data)
        path.write_text(yaml.safe_dump(config))
        cfg = load_config(path)
        if mined:  # the same pairs as crl_clip_b16's, in its order
            back = load_data(cfg.data, progress=False).train
            reread = list(zip(back.a, back.b, strict=True))
            present = set(reread)
            kept = [pair for pair in zip(train.a, train.b, strict=True) if pair in present]
            assert reread == kept, "the mined pairs are not read back in crl_clip_b16's order"
        wall = time.perf_counter()
        result = fit(cfg, Path(tmp) / "run", progress=False, stop_at=steps)
        train_seconds = time.perf_counter() - wall
        metrics_file = Path(tmp) / "run" / "metrics.jsonl"
        lines = metrics_file.read_text().splitlines() if metrics_file.exists() else []
        state = load_checkpoint(Path(tmp) / "run" / CHECKPOINT_FILE, config_hash=config_hash(cfg))
        wall = time.perf_counter()
        built = build_run(cfg, torch.device("cpu"))  # (reads the mined file, if any)
        built.model.load_state_dict(state["model"])
    za, zb = encode_split(built.model, built.model.prepare(test), batch_size=64)
    scores, hits = _scored(za, zb)
    prefixes = prefix_retrieval_metrics(za, zb, MATRYOSHKA_DIMS, normalize=True, ks=list(KS))
    return {"train_seconds": train_seconds, "steps": result.step,
            "eval_seconds": time.perf_counter() - wall, "num_test": len(test),
            "config": config, "metrics": scores, "prefix_metrics": prefixes,
            "hits@1": hits, **extra,
            "last_log": json.loads(lines[-1]) if lines else None}


def run(entry: str, train_pairs: int, test_pairs: int) -> dict[str, Any]:
    if entry == "frozen":
        return frozen(train_pairs, test_pairs)
    if entry == "sentence_transformers":
        return sentence_transformers(train_pairs, test_pairs)
    if entry == "crl_clip_b64":
        return crl_entry("clip", 64, train_pairs, test_pairs)
    if entry == "crl_gcl_b16":
        return crl_entry("gcl", 16, train_pairs, test_pairs)
    if entry == "crl_clip_b16":
        return crl_entry("clip", 16, train_pairs, test_pairs)
    if entry == "crl_gcl_b16_tau07":
        return crl_entry("gcl", 16, train_pairs, test_pairs, temperature=0.07)
    if entry == "crl_gcl_pos_b16":
        return crl_entry("gcl", 16, train_pairs, test_pairs, include_positive=True)
    if entry == "crl_clip_b64_matryoshka":
        return crl_entry("clip", 64, train_pairs, test_pairs, matryoshka=True)
    if entry == "crl_clip_b16_mined":
        return crl_entry("clip", 16, train_pairs, test_pairs, mined=True)
    if entry == "crl_clip_b16_guide":
        return crl_entry("clip", 16, train_pairs, test_pairs, guide=True)
    if entry == "crl_clip_b16_matryoshka":
        return crl_entry("clip", 16, train_pairs, test_pairs, matryoshka=True)
    raise SystemExit(f"unknown entry {entry!r}; choose from {', '.join(ENTRIES)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entry", choices=ENTRIES)
    parser.add_argument("--train-pairs", type=int, default=2560)
    parser.add_argument("--test-pairs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import sentence_transformers  # noqa: F401  (part of every entry's baseline)

    baseline = current_rss()
    before = machine_state()
    wall = time.perf_counter()
    out = run(args.entry, args.train_pairs, args.test_pairs)
    recall = out["metrics"]
    n = out.get("num_test") or 0
    for key in ("x2y", "y2x"):
        value = recall.get(f"retrieval/{key}_recall@1")
        if value is not None and n:
            out[f"{key}_recall@1_se"] = math.sqrt(value * (1 - value) / n)
    out.update({"entry": args.entry, "train_pairs": args.train_pairs,
                "test_pairs": args.test_pairs, "threads": args.threads,
                "wall_seconds": time.perf_counter() - wall,
                "peak_rss_gib": peak_rss() / GIB, "baseline_rss_gib": baseline / GIB,
                "peak_above_baseline_gib": (peak_rss() - baseline) / GIB,
                "machine_before": before, "machine_after": machine_state()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
