"""``crl study batch``: the in-batch batch size B for a config, at a fixed sample budget
(docs/batch.md)."""

from crl.experiments.batch.study import BatchStudy, run_batch_study

__all__ = ["BatchStudy", "run_batch_study"]
