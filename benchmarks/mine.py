"""Hard-negative mining: ``crl.mine.mine_hard_negatives`` against sentence-transformers' own
``sentence_transformers.util.mine_hard_negatives`` on the same pairs, model and options, timed
in the same process, one after the other, with the load average recorded.

The pairs are the first ``--pairs`` training pairs of pycode's fixed split (docstring ->
function); the model is the bundled all-MiniLM-L6-v2. Three timings:

- ``st``: sentence-transformers, encoding included (``use_faiss`` as ``--faiss``);
- ``crl_same_model``: crl with the same ``SentenceTransformer`` object (same embeddings, so the
  negatives must agree up to ties: the agreement is recorded);
- ``crl_minilm``: crl with ``--model minilm`` (crl's own MiniLM feature path, on an empty
  feature cache, so it encodes every text).

And the search alone on the same embeddings: sentence-transformers reading its own embedding
cache (``cache_folder``, a second call) against :func:`crl.mine.select_negatives`.

    .venv/bin/python benchmarks/mine.py --pairs 2000 --out benchmarks/results/mine.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

OPTIONS = {"num_negatives": 3, "relative_margin": 0.05}


def _pairs(n: int) -> tuple[list[str], list[str]]:
    from crl.data import load_data
    from crl.data.config import DataConfig

    train = load_data(DataConfig(name="pycode", num_train=n), progress=False).train
    return list(train.a)[:n], list(train.b)[:n]  # type: ignore[attr-defined]


def _load(cache: Path, prefix: str) -> Any:
    import numpy as np

    return np.load(next(cache.glob(prefix + "*.npy")))


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--faiss", action="store_true", help="faiss on both sides")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/mine.json"))
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives as st_mine

    from crl.eval.encoder import SentenceTransformerEncoder, load_encoder
    from crl.mine import MiningOptions, mine_hard_negatives, select_negatives
    from crl.models.text import minilm_model_dir

    anchors, positives = _pairs(args.pairs)
    model = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    options = MiningOptions(**OPTIONS)  # type: ignore[arg-type]
    backend = "faiss" if args.faiss else "torch"
    load_before = os.getloadavg()
    data = Dataset.from_dict({"anchor": anchors, "positive": positives})
    cache = Path(tempfile.mkdtemp())
    peer, t_st = _timed(lambda: st_mine(
        data, model, output_format="n-tuple", verbose=False, batch_size=32,
        use_faiss=args.faiss, cache_folder=str(cache),
        relative_margin=OPTIONS["relative_margin"], num_negatives=OPTIONS["num_negatives"]))
    _, t_st_search = _timed(lambda: st_mine(  # its embeddings from its cache: the search alone
        data, model, output_format="n-tuple", verbose=False, batch_size=32,
        use_faiss=args.faiss, cache_folder=str(cache),
        relative_margin=OPTIONS["relative_margin"], num_negatives=OPTIONS["num_negatives"]))
    same = SentenceTransformerEncoder(model, batch_size=32)
    ours, t_same = _timed(lambda: mine_hard_negatives(anchors, positives, same, options=options,
                                                       backend=backend))
    minilm = load_encoder("minilm", batch_size=32, cache_dir=tempfile.mkdtemp())
    _, t_minilm = _timed(lambda: mine_hard_negatives(anchors, positives, minilm,
                                                      options=options, backend=backend))
    texts = list(dict.fromkeys(positives))
    queries = list(dict.fromkeys(anchors))
    # the embeddings sentence-transformers cached (its corpus and query order are these)
    zc = torch.from_numpy(_load(cache, "corpus_embeddings_"))
    zq = torch.from_numpy(_load(cache, "query_embeddings_"))
    assert zc.shape[0] == len(texts) and zq.shape[0] == len(queries)
    row = {t: i for i, t in enumerate(texts)}
    qid = {t: i for i, t in enumerate(queries)}
    own: list[list[int]] = [[] for _ in queries]
    for a, b in zip(anchors, positives, strict=True):
        if row[b] not in own[qid[a]]:
            own[qid[a]].append(row[b])
    _, t_search = _timed(lambda: select_negatives(zq, zc, own, options, backend=backend))
    load_after = os.getloadavg()

    theirs = {(r["anchor"], r["positive"]): [r[f"negative_{i}"] for i in (1, 2, 3)]
              for r in peer}
    mine = {(a, b): n for a, b, n in zip(anchors, positives, ours.negatives, strict=True)
            if n is not None}
    agree = sum(mine.get(k) == v for k, v in theirs.items())
    result = {
        "pairs": len(anchors), "options": OPTIONS, "faiss": args.faiss,
        "torch_threads": torch.get_num_threads(),
        "seconds": {"st": t_st, "crl_same_model": t_same, "crl_minilm": t_minilm,
                    "st_search_only": t_st_search, "crl_search_only": t_search},
        "ratio_crl_over_st": {"same_model": t_same / t_st, "minilm": t_minilm / t_st,
                              "search_only": t_search / t_st_search},
        "rows_with_negatives": {"st": len(theirs), "crl": len(mine)},
        "rows_agreeing": agree, "same_rows": set(theirs) == set(mine),
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
