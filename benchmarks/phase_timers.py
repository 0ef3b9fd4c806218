"""Where a study worker's CPU goes, without a profiler: process-time timers around the phases'
functions while one process trains groups of the quick negatives grid as a worker does
(``fit_group``, one thread). cProfile (``benchmarks/profile_run.py``) charges each of the many
small calls its own overhead; timers around a few functions do not.

    .venv/bin/python benchmarks/phase_timers.py --groups 4      # about 30 s here

Prints CPU seconds per group and per phase (summed over the groups; a nested phase is indented
and also counted in its parent).
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import tempfile
import time
from typing import Any

#: ``(module, attribute path, label)``: the label's time is the attribute's CPU time.
PHASES = [
    ("crl.train.grouped", "_build", "build"),
    ("crl.models.tokenizer", "MiniLMTokenizer._encode", "  tokenise"),
    ("crl.train.trainer", "TrainingRun.start", "start"),
    ("crl.train.trainer", "Trainer.train", "train"),
    ("crl.train.trainer", "Trainer._loader", "  loader"),
    ("crl.train.steps.towers", "StackedTowers.__call__", "  towers"),
    ("crl.losses.gcl_group", "GroupedGcl.__call__", "  loss"),
    ("torch.autograd", "backward", "  backward"),
    ("crl.train.trainer", "TrainingRun.update", "  update"),
    ("crl.train.step", "clip_gradients", "    clip"),
    ("crl.train.lazy_adamw", "LazyAdamW._dense_step", "    dense AdamW"),
    ("crl.train.lazy_adamw", "LazyAdamW._sparse_step", "    lazy rows"),
    ("crl.train.trainer", "TrainingRun.checkpoint", "  checkpoint"),
    ("crl.train.trainer", "TrainingRun.evaluate", "  evaluate"),
]


def _timed(totals: collections.Counter[str]) -> None:
    """Wrap each phase's function so that its CPU time adds to ``totals[label]``."""
    for module, path, label in PHASES:
        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def timed(*args: Any, _inner: Any = inner, _label: str = label, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                totals[_label] += time.process_time() - start

        setattr(owner, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4, help="(n, seed) groups to train")
    args = parser.parse_args()
    import torch

    from crl.experiments.negatives import NegativesStudy
    from crl.train import fit_group, validate_config

    torch.set_num_threads(1)
    totals: collections.Counter[str] = collections.Counter()
    _timed(totals)
    groups: dict[tuple[int, int], dict[str, Any]] = collections.defaultdict(dict)
    for spec in NegativesStudy("quick").runs():
        if "stage" not in spec.tags:
            groups[(spec.tags["n"], spec.tags["seed"])][spec.run_id] = spec
    keys = sorted(groups)[:: max(1, len(groups) // args.groups)][: args.groups]
    for key in keys:
        specs = [groups[key][k] for k in sorted(groups[key])]
        with tempfile.TemporaryDirectory() as out:
            start = time.process_time()
            fit_group([validate_config(s.config) for s in specs],
                      [f"{out}/{s.run_id}" for s in specs], final_checkpoint=False)
            print(f"group n={key[0]} seed={key[1]}: {len(specs)} runs, "
                  f"{time.process_time() - start:.2f} CPU s", flush=True)
    for _, _, label in PHASES:
        print(f"{label:16s} {totals[label]:7.2f}")


if __name__ == "__main__":
    main()
