"""``evaluate`` reuses what it already computed: with embedding probe features the split's
view-a embeddings serve the probe, and the metrics equal computing them again."""

from __future__ import annotations

import torch

from crl.eval import knn_probe, linear_probe
from crl.train import load_config
from crl.train.build import build_run
from crl.train.evaluation import encode_split, evaluate, probe_features


def test_embedding_probe_features_are_the_encoded_split() -> None:
    cfg = load_config("digits-simclr", ["model.embed_dim=8", "model.hidden_dim=16",
                                        "eval.probe_features=embedding", "eval.batch_size=100"])
    built = build_run(cfg, torch.device("cpu"))
    model, test, train = built.model, built.test_ds, built.train_ds
    metrics = evaluate(model, test, cfg.eval, temperature=0.2, train_split=train)
    za, _ = encode_split(model, test, batch_size=100)
    again = probe_features(model, test, batch_size=100, representation=False)
    assert torch.equal(za, again)  # what the reuse relies on
    features = probe_features(model, train, batch_size=100, representation=False)
    lin = linear_probe(features, train.labels, again, test.labels)
    knn = knn_probe(features, train.labels, again, test.labels, k=cfg.eval.knn_k)
    assert metrics["probe/linear_acc"] == lin.accuracy
    assert metrics["probe/linear_balanced_acc"] == lin.balanced_accuracy
    assert metrics["probe/knn_acc"] == knn.accuracy
    assert metrics["probe/knn_balanced_acc"] == knn.balanced_accuracy
