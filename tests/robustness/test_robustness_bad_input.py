"""The bad-input table of ``docs/errors.md``, one test per row.

:data:`CASES` is the single source: ``docs/errors.md``'s table is generated from it
(``python tests/robustness/test_robustness_bad_input.py > /tmp/table.md``) and
:func:`test_docs_table_lists_exactly_these_cases` checks that the document holds exactly these
rows. Each API case must raise the listed crl error class with a message containing the listed
words; each CLI case must exit with code 2 and print one line on stderr starting with ``error:``
(and with ``--debug`` raise the error instead, so a traceback is shown). Every case that involves
files checks that the files it found are byte for byte untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bad_input_files as bad
import numpy as np
import pytest
import torch
import typer
from test_robustness_security import _locked_elsewhere, _plant_factory
from typer.testing import CliRunner

from crl.errors import CrlError, CrlTypeError, CrlValueError, StaleRunError
from shared_tensors import make_pair

# ----------------------------------------------------------------------------- the cases

Thunk = Callable[[], object]


@dataclass(frozen=True)
class Case:
    """One row of the table.

    Attributes:
        id: The test id and the row's first column.
        where: ``"API"`` or ``"CLI"``.
        input: What is wrong (markdown).
        error: The error class raised by the API (CLI cases: the class behind the one line).
        message: Words the message contains (shown in the table).
        fix: What the user should do (markdown).
        api: For API cases, ``setup(tmp) -> thunk`` that raises when called.
        cli: For CLI cases, ``setup(tmp) -> argv`` of ``crl``.
    """

    id: str
    where: str
    input: str
    error: type[BaseException]
    message: str
    fix: str
    api: Callable[[Path], Thunk] | None = None
    cli: Callable[[Path], list[str]] | None = None


def _pair(batch: int = 4, dim: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return make_pair(batch, dim, dtype=torch.float32)


def _with(value: float, where: tuple[int, int] = (1, 2)) -> torch.Tensor:
    a, _ = _pair()
    a[where] = value
    return a


def _losses() -> Any:
    import crl.losses as losses

    return losses


def _info_nce(**kwargs: Any) -> Callable[[Path], Thunk]:
    def setup(_: Path) -> Thunk:
        a, b = _pair()
        args = {"a": a, "b": b, **kwargs}
        return lambda: _losses().info_nce(args.pop("a"), args.pop("b"), **args)
    return setup


def _empty_row_mask() -> torch.Tensor:
    mask = ~torch.eye(4, dtype=torch.bool)
    mask[2] = False
    mask[2, 2] = True  # only the diagonal, which is the positive
    return mask


def _delta() -> torch.Tensor:
    return torch.tensor([[0.0, 1.0, -1.0], [0.5, 0.2, -0.3]])


def _config_api(*overrides: str) -> Callable[[Path], Thunk]:
    def setup(_: Path) -> Thunk:
        from crl.train import load_config

        return lambda: load_config("synthetic-gaussian", list(overrides))
    return setup


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def _npz(path: Path, **arrays: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    return path


def _pairs_file(make: Callable[[Path], Path]) -> Callable[[Path], Thunk]:
    def setup(tmp: Path) -> Thunk:
        from crl.data.files import load_pair_file

        path = make(tmp)
        return lambda: load_pair_file(path)
    return setup


def _bad_jsonl(tmp: Path) -> Path:
    good = json.dumps({"a": "x", "b": "y"})
    return _write(tmp / "pairs.jsonl", f"{good}\n{good}\n{{\"a\": \"x\", \"b\": \n{good}\n")


# A tiny run: 64 pairs, batches of 16, 6 steps, checkpoints every 3.
TINY = ["data.num_train=64", "data.synthetic.num_samples=128", "train.batch_size=16",
        "train.steps=6", "train.checkpoint_every=3", "train.log_every=1", "train.num_threads=1",
        "eval.ks=[1]", "eval.probe=false"]


def _tiny(*extra: str) -> Any:
    from crl.train import load_config

    return load_config("synthetic-gaussian", [*TINY, *extra])


def _stopped_run(tmp: Path, stop_at: int | None = 3) -> Path:
    from crl.train import fit

    run = tmp / "run"
    fit(_tiny(), run, progress=False, stop_at=stop_at)
    return run


def _fit_resume(*extra: str, finished: bool = False) -> Callable[[Path], Thunk]:
    def setup(tmp: Path) -> Thunk:
        from crl.train import fit

        run = _stopped_run(tmp, None if finished else 3)
        return lambda: fit(_tiny(*extra), run, progress=False, resume=True)
    return setup


def _damaged_checkpoint(damage: Callable[[bytes], bytes]) -> Callable[[Path], Thunk]:
    def setup(tmp: Path) -> Thunk:
        from crl.train import fit

        run = _stopped_run(tmp)
        path = run / "checkpoint.pt"
        path.write_bytes(damage(path.read_bytes()))
        return lambda: fit(_tiny(), run, progress=False, resume=True)
    return setup


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]


def _gcl(index: list[int], num_samples: int = 10) -> Callable[[Path], Thunk]:
    def setup(_: Path) -> Thunk:
        a, b = _pair()
        loss = _losses().GlobalContrastiveLoss(num_samples=num_samples)
        return lambda: loss(a, b, torch.tensor(index))
    return setup


def _cli_train(*extra: str) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        args = ["train", "synthetic-gaussian", "--out", str(tmp / "runs"), "--no-progress"]
        for item in TINY:
            args += ["--set", item]
        return args + [part.replace("{tmp}", str(tmp)) for part in extra]
    return setup


def _cli_files(make: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        path = make(tmp)
        return _cli_train("--set", "data.name=files", "--set", f"data.files.path={path}",
                          "--set", "data.num_train=null")(tmp)
    return setup


def _cli_pretrained(make: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    """``crl train`` on good text pairs with ``model.pretrained`` the directory ``make`` wrote."""
    def setup(tmp: Path) -> list[str]:
        model = make(tmp)
        return [*_cli_files(bad.good_jsonl)(tmp), "--set", "model.kind=transformer",
                "--set", f"model.pretrained={model}", "--set", "model.embed_dim=null"]
    return setup


def _tiny_bert(tmp: Path) -> Path:
    from tiny_bert import write_tiny_bert

    return write_tiny_bert(tmp / "tiny-bert")


def _shell_checkpoint_run(tmp: Path, protocol: int | None = None) -> Path:
    """A stopped run whose checkpoint.pt would run ``touch tmp/pwned`` if trusted (written by
    torch.save, or by ``pickle.dumps`` with ``protocol``)."""
    run = _stopped_run(tmp)
    bad.os_system_checkpoint(run / "checkpoint.pt", tmp / "pwned", protocol)
    return run


def _cli_existing_run(tmp: Path) -> list[str]:
    from crl.train import config_hash

    args = _cli_train()(tmp)
    _stopped_run(tmp).rename(_mkparent(tmp / "runs" / f"synthetic-gaussian-{config_hash(_tiny())}"))
    return args


def _cli_truncated_checkpoint(tmp: Path) -> list[str]:
    from crl.train import config_hash

    args = _cli_train("--resume")(tmp)
    run = _stopped_run(tmp).rename(
        _mkparent(tmp / "runs" / f"synthetic-gaussian-{config_hash(_tiny())}"))
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 3])
    return args


class _CreatesFile:
    """Unpickling it would call ``open(path, "w")``: a checkpoint that runs code when loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _hostile_run(tmp: Path) -> Path:
    """A stopped run whose checkpoint.pt would create ``tmp/pwned`` if trusted."""
    from crl.train.checkpoint import CHECKPOINT_KEYS

    run = _stopped_run(tmp)
    state: dict[str, Any] = {key: 0 for key in CHECKPOINT_KEYS}
    state["rng"] = _CreatesFile(tmp / "pwned")
    torch.save(state, run / "checkpoint.pt")
    return run


def _fit_hostile(tmp: Path) -> Thunk:
    from crl.train import fit

    run = _hostile_run(tmp)
    return lambda: fit(_tiny(), run, progress=False, resume=True)


def _mkparent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _under_a_file(tmp: Path) -> Path:
    """A directory path below a regular file: not creatable, even by root."""
    return _write(tmp / "file.txt", "keep me\n") / "sub"


def _study(*extra: str) -> Callable[[Path], list[str]]:
    def setup(tmp: Path) -> list[str]:
        return ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--workers",
                "1", "--no-progress", "--out", str(tmp / "runs"),
                *[part.replace("{tmp}", str(tmp)) for part in extra]]
    return setup


def _report_on(options: dict[str, Any], **top: Any) -> Callable[[Path], list[str]]:
    """``crl report`` on a study directory whose ``study.json`` holds ``options`` (and the
    top-level keys ``top``)."""
    def setup(tmp: Path) -> list[str]:
        described = {"study": "negatives", "preset": "smoke", "options": options, **top}
        return ["report", str(_write(tmp / "negatives" / "study.json",
                                      json.dumps(described)).parent)]
    return setup


#: Lock holders a case started (another live process); stopped after each test.
_HOLDERS = contextlib.ExitStack()


@pytest.fixture(autouse=True)
def _stop_lock_holders() -> Any:
    yield
    _HOLDERS.close()


def _cli_planted_factory(tmp: Path) -> list[str]:
    """``crl eval`` on a copy of a stopped run whose config.json names ``evilmod:build``."""
    return ["eval", str(_plant_factory(_stopped_run(tmp), tmp, "evilmod:build"))]


def _cli_locked_run(tmp: Path) -> list[str]:
    """``crl train --resume`` into a stopped run whose lock another live process holds."""
    args = _cli_existing_run(tmp)
    (run,) = (tmp / "runs").iterdir()
    _HOLDERS.enter_context(_locked_elsewhere(run))
    return [*args, "--resume"]


def _study_dir(tmp: Path) -> Path:
    """The study directory of :func:`_study`'s command (``--out tmp/runs``)."""
    return _mkparent(tmp / "runs" / "negatives" / "x").parent


def _cli_study_linked_run(tmp: Path) -> list[str]:
    """``crl study`` into a study directory whose run directory is a link to one elsewhere."""
    elsewhere = _mkparent(tmp / "elsewhere" / "x").parent
    (_study_dir(tmp) / "negatives-n64-m32-seed0").symlink_to(elsewhere, target_is_directory=True)
    return _study("--ns", "64")(tmp)


def _cli_study_other_options(tmp: Path) -> list[str]:
    """``crl study`` into a study directory whose study.json records the quick preset."""
    recorded = {"study": "negatives", "preset": "quick", "options": {"data": "synthetic"}}
    _write(_study_dir(tmp) / "study.json", json.dumps(recorded))
    return _study()(tmp)


def _cli_encode_into_a_directory(tmp: Path) -> list[str]:
    existing = _mkparent(tmp / "embeddings" / "x").parent
    return ["encode", str(bad.text_run(tmp)), str(bad.good_jsonl(tmp)), "--out", str(existing),
            "--no-progress"]


def _cli_eval_latin1_config(tmp: Path) -> list[str]:
    """``crl eval`` on a stopped run whose config.json holds a Latin-1 byte (found by the fuzz
    of test_robustness_rundir_fuzz.py: a UnicodeDecodeError traceback before)."""
    run = _stopped_run(tmp)
    text = (run / "config.json").read_text()
    (run / "config.json").write_bytes(text.replace('"config"', '"caf\xe9"', 1).encode("latin-1"))
    return ["eval", str(run)]


def _beir_copy(tmp: Path, qrels: str | None = None) -> Path:
    """tests/data/beir_small copied under ``tmp``, its test qrels replaced by ``qrels``."""
    import shutil

    root = Path(__file__).resolve().parents[1] / "data" / "beir_small"
    copy = tmp / "beir"
    shutil.copytree(root, copy)
    if qrels is not None:
        (copy / "qrels" / "test.tsv").write_text(qrels)
    return copy


def _cli_eval_beir(*extra: str, qrels: str | None = None) -> Callable[[Path], list[str]]:
    return lambda tmp: ["eval", "--model", "minilm", "--beir", str(_beir_copy(tmp, qrels)),
                        *[x.replace("TMP", str(tmp)) for x in extra]]


def _empty_python_root(tmp: Path) -> Callable[[], object]:
    from crl.data import DataConfig, load_data

    root = tmp / "src"
    _write(root / "README.md", "no python here\n")
    _write(root / "notes.txt", "still none\n")
    return lambda: load_data(DataConfig(name="pycode", pycode={"roots": [str(root)],
                                                               "cache_dir": str(tmp / "cache")}))


CASES: list[Case] = [
    # --- losses: embeddings ---------------------------------------------------------------
    Case("nan-embedding", "API", "`info_nce(a, b)` with a NaN in `a`", CrlValueError,
         "info_nce: `a` must be finite; got 1 NaN/Inf value(s)",
         "find where the NaN comes from (learning rate, data); `torch.nan_to_num` is not a fix",
         api=lambda _: lambda: _losses().info_nce(_with(math.nan), _pair()[1])),
    Case("inf-embedding", "API", "`clip_loss(a, b, 10.0)` with an Inf in `b`", CrlValueError,
         "clip_loss: `b` must be finite",
         "check the encoder's output (overflow in float16?)",
         api=lambda _: lambda: _losses().clip_loss(_pair()[0], _with(math.inf), 10.0)),
    Case("shape-mismatch", "API", "`info_nce` with `a` (4, 3) and `b` (4, 5)", CrlValueError,
         "`a` and `b` must have the same shape (B, D); got (4, 3) and (4, 5)",
         "project both towers to the same `embed_dim`",
         api=lambda _: lambda: _losses().info_nce(torch.randn(4, 3), torch.randn(4, 5))),
    Case("batch-mismatch", "API", "`siglip_loss` with `a` (4, 3) and `b` (3, 3)", CrlValueError,
         "siglip_loss: `a` and `b` must have the same shape",
         "pass the two views of the same batch",
         api=lambda _: lambda: _losses().siglip_loss(torch.randn(4, 3), torch.randn(3, 3),
                                                     10.0, -10.0)),
    Case("one-dim-embedding", "API", "`info_nce` with 1-D embeddings of shape (4,)",
         CrlValueError, "info_nce: `a` must be a 2-D tensor; got shape (4,)",
         "stack the batch as rows, shape (B, D)",
         api=lambda _: lambda: _losses().info_nce(torch.randn(4), torch.randn(4))),
    Case("integer-dtype", "API", "`info_nce` with int64 embeddings", CrlTypeError,
         "info_nce: `a` must have a floating dtype; got torch.int64", "convert with `.float()`",
         api=lambda _: lambda: _losses().info_nce(torch.ones(4, 3, dtype=torch.long),
                                                  torch.ones(4, 3, dtype=torch.long))),
    Case("numpy-input", "API", "`contrastive_risk` given numpy arrays", CrlTypeError,
         "contrastive_risk: `a` must be a torch.Tensor; got array(",
         "convert with `torch.from_numpy`",
         api=lambda _: lambda: _losses().contrastive_risk(np.ones((4, 3)), np.ones((4, 3)),
                                                          temperature=0.1)),
    Case("batch-of-one", "API", "`info_nce` with B = 1", CrlValueError,
         "need a batch of at least 2 pairs (B >= 2)",
         "use a batch of at least 2 pairs (every anchor needs a negative)",
         api=lambda _: lambda: _losses().info_nce(torch.randn(1, 3), torch.randn(1, 3))),
    # --- losses: hyperparameters ------------------------------------------------------------
    Case("temperature-zero", "API", "`info_nce(..., temperature=0)`", CrlValueError,
         "info_nce: `temperature` must be positive and finite; got 0.0",
         "use a temperature > 0 (0.05 to 1 is usual)", api=_info_nce(temperature=0)),
    Case("temperature-negative", "API", "`info_nce(..., temperature=-0.1)`", CrlValueError,
         "`temperature` must be positive and finite; got -0.1", "use a temperature > 0",
         api=_info_nce(temperature=-0.1)),
    Case("temperature-nan", "API", "`info_nce(..., temperature=nan)`", CrlValueError,
         "`temperature` must be positive and finite; got nan",
         "check where the temperature is computed", api=_info_nce(temperature=math.nan)),
    Case("temperature-string", "API", "`info_nce(..., temperature=\"0.1\")`", CrlTypeError,
         "`temperature` must be a positive number; got '0.1'", "pass a number",
         api=_info_nce(temperature="0.1")),
    Case("scale-zero", "API", "`clip_loss(a, b, scale=0.0)`", CrlValueError,
         "clip_loss: `scale` must be positive and finite; got 0.0",
         "pass `exp(logit_scale)` (> 0), not the logit scale itself",
         api=lambda _: lambda: _losses().clip_loss(*_pair(), 0.0)),
    Case("scale-nan", "API", "`siglip_loss(a, b, scale=nan, bias=-10)`", CrlValueError,
         "siglip_loss: `scale` must be positive and finite; got nan",
         "check the learnable logit scale (is it clamped?)",
         api=lambda _: lambda: _losses().siglip_loss(*_pair(), math.nan, -10.0)),
    Case("scale-negative-tiled", "API", "`clip_loss(a, b, scale=-1.0, block_size=2)`",
         CrlValueError, "clip_loss: `scale` must be positive and finite; got -1.0",
         "pass `exp(logit_scale)` (> 0)",
         api=lambda _: lambda: _losses().clip_loss(*_pair(), -1.0, block_size=2)),
    Case("siglip-bias-nan", "API", "`siglip_loss(a, b, 10.0, bias=nan)`", CrlValueError,
         "siglip_loss: `bias` must be finite; got nan", "check the learnable bias (init -10)",
         api=lambda _: lambda: _losses().siglip_loss(*_pair(), 10.0, math.nan)),
    Case("alpha-zero", "API", "`oce_risk(delta, phi=\"cvar\", alpha=0)`", CrlValueError,
         "oce_risk: `alpha` must be positive and finite; got 0.0",
         "use a tail fraction alpha in (0, 1]",
         api=lambda _: lambda: _losses().oce_risk(_delta(), phi="cvar", alpha=0)),
    Case("alpha-negative", "API", "`oce_risk(delta, phi=\"cvar\", alpha=-0.2)`", CrlValueError,
         "oce_risk: `alpha` must be positive and finite; got -0.2",
         "use a tail fraction alpha in (0, 1]",
         api=lambda _: lambda: _losses().oce_risk(_delta(), phi="cvar", alpha=-0.2)),
    Case("alpha-nan", "API", "`oce_risk(delta, phi=\"cvar\", alpha=nan)`", CrlValueError,
         "oce_risk: `alpha` must be positive and finite; got nan",
         "use a tail fraction alpha in (0, 1]",
         api=lambda _: lambda: _losses().oce_risk(_delta(), phi="cvar", alpha=math.nan)),
    Case("gcl-gamma-zero", "API", "`GlobalContrastiveLoss(num_samples=10, gamma=0)`",
         CrlValueError, "GlobalContrastiveLoss: `gamma` must be positive and finite; got 0.0",
         "use gamma in (0, 1] (0.9 is usual)",
         api=lambda _: lambda: _losses().GlobalContrastiveLoss(num_samples=10, gamma=0.0)),
    Case("alpha-above-one", "API", "`oce_risk(delta, phi=\"cvar\", alpha=1.5)`", CrlValueError,
         "oce_risk: `alpha` must be in (0, 1]", "use a tail fraction alpha in (0, 1]",
         api=lambda _: lambda: _losses().oce_risk(_delta(), phi="cvar", alpha=1.5)),
    Case("kl-without-temperature", "API", "`oce_risk(delta, phi=\"kl\")` without a temperature",
         CrlValueError, "oce_risk: phi='kl' needs `temperature`", "pass `temperature=tau`",
         api=lambda _: lambda: _losses().oce_risk(_delta(), phi="kl")),
    Case("unknown-phi", "API", "`oce_risk(delta, phi=\"entropy\")`", CrlValueError,
         "oce_risk: unknown phi 'entropy'; valid values are 'kl', 'cvar', 'softplus'",
         "use one of the listed names",
         api=lambda _: lambda: _losses().oce_risk(_delta(), phi="entropy")),
    Case("unknown-pairwise-loss", "API", "`pairwise_risk(delta, loss=\"square\")`",
         CrlValueError, "pairwise_risk: unknown loss 'square'; valid values are",
         "use logistic, exponential, squared_hinge or hinge",
         api=lambda _: lambda: _losses().pairwise_risk(_delta(), loss="square")),
    Case("kmeans-k-out-of-range", "API", "`relaxed_kmeans(z, k=5)` with z of shape (4, 3)",
         CrlValueError, "relaxed_kmeans: `k` must be in [1, 3]; got 5", "use 1 <= k <= D",
         api=lambda _: lambda: _losses().relaxed_kmeans(torch.randn(4, 3), 5)),
    Case("recall-k-zero", "API", "`retrieval_metrics(a, b, ks=[0, 5])`", CrlValueError,
         "retrieval_metrics: `ks[...]` must be in >= 1; got 0", "use cut-offs k >= 1",
         api=lambda _: lambda: __import__("crl.eval", fromlist=["x"]).retrieval_metrics(
             *_pair(), ks=[0, 5])),
    # --- masks, negatives, labels, GCL ------------------------------------------------------
    Case("mask-empty-row", "API", "`info_nce` with a negatives mask whose row 2 is empty",
         CrlValueError, "every row of `negatives_mask` needs at least one negative; 1 row(s) "
         "have none (first: [2])", "give every anchor a negative, or drop that anchor",
         api=_info_nce(negatives_mask=_empty_row_mask())),
    Case("mask-float", "API", "`info_nce` with a float negatives mask", CrlTypeError,
         "`negatives_mask` must have dtype torch.bool; got torch.float32",
         "convert with `.bool()`", api=_info_nce(negatives_mask=torch.ones(4, 4))),
    Case("mask-shape", "API", "`info_nce` with a (4, 3) negatives mask for B = 4",
         CrlValueError, "`negatives_mask` must have shape (4, 4); got (4, 3)",
         "build the mask for the batch, (B, B)",
         api=_info_nce(negatives_mask=torch.ones(4, 3, dtype=torch.bool))),
    Case("m-below-one", "API", "`NegativeSets(n=10, m=0)`", CrlValueError,
         "NegativeSets: `m` must be in [1, 10]; got 0", "use 1 <= m <= n",
         api=lambda _: lambda: __import__("crl.negatives", fromlist=["x"]).NegativeSets(10, 0)),
    Case("m-above-n", "API", "`NegativeSets(n=10, m=11)`", CrlValueError,
         "NegativeSets: `m` must be in [1, 10]; got 11", "use m <= n (or m_fraction in a config)",
         api=lambda _: lambda: __import__("crl.negatives", fromlist=["x"]).NegativeSets(10, 11)),
    Case("unknown-regime", "API", "`NegativeSets(10, 3, regime=\"global\")`", CrlValueError,
         "NegativeSets: unknown regime 'global'; valid values are 'shared', 'independent'",
         "use shared or independent",
         api=lambda _: lambda: __import__("crl.negatives", fromlist=["x"]).NegativeSets(
             10, 3, regime="global")),
    Case("labels-wrong-length", "API", "`supcon_loss(z, labels)` with 6 rows and 5 labels",
         CrlValueError, "supcon_loss: `labels` must have shape (6,) to match `z`; got (5,)",
         "give one label per row of z (both views stacked)",
         api=lambda _: lambda: _losses().supcon_loss(torch.randn(6, 3),
                                                     torch.tensor([0, 1, 0, 1, 0]))),
    Case("probe-labels-wrong-length", "API", "`linear_probe` with 8 train rows and 7 labels",
         CrlValueError, "linear_probe: `train_y` must have shape (8,) to match the features",
         "pass the labels of the same items as the features",
         api=lambda _: lambda: __import__("crl.eval", fromlist=["x"]).linear_probe(
             torch.randn(8, 3), torch.zeros(7, dtype=torch.long), torch.randn(4, 3),
             torch.zeros(4, dtype=torch.long))),
    Case("gcl-index-out-of-range", "API", "`GlobalContrastiveLoss(num_samples=10)` given "
         "index 12", CrlValueError, "`index` must hold dataset indices in [0, 9]; got values "
         "in [0, 12]", "pass dataset indices (the `index` of each batch item)",
         api=_gcl([0, 1, 2, 12])),
    Case("gcl-repeated-index", "API", "`GlobalContrastiveLoss` given index [0, 1, 1, 2]",
         CrlValueError, "`index` must not repeat a sample within a batch",
         "sample a batch without replacement", api=_gcl([0, 1, 1, 2])),
    # --- configs ----------------------------------------------------------------------------
    Case("unknown-preset", "API", "`load_config(\"digits-simclr2\")`", CrlValueError,
         "load_config: CONFIG must be a YAML file or a preset name; got 'digits-simclr2'",
         "use a file path or one of the listed presets",
         api=lambda _: lambda: __import__("crl.train", fromlist=["x"]).load_config(
             "digits-simclr2")),
    Case("unknown-config-key", "API", "`--set train.stepz=3` (a typo)", CrlValueError,
         "train.stepz: unknown key; valid keys here: seed, batch_size, epochs, steps",
         "use one of the listed keys", api=_config_api("train.stepz=3")),
    Case("mistyped-config-value", "API", "`--set train.steps=ten`", CrlValueError,
         "train.steps: Input should be a valid integer", "give an integer",
         api=_config_api("train.steps=ten")),
    Case("unknown-loss", "API", "`--set loss.name=infonce`", CrlValueError,
         "loss.name: Input should be 'info_nce', 'clip', 'siglip'",
         "use one of the listed loss names", api=_config_api("loss.name=infonce")),
    Case("config-not-finite", "API", "`--set optim.lr=nan` (or inf, in any float of the "
         "config)", CrlValueError, "optim.lr: Input should be a finite number",
         "give a finite number", api=_config_api("optim.lr=nan")),
    Case("config-check-names-its-key", "API", "`--set eval.ks=[]` (a section's own check)",
         CrlValueError, "eval.ks: ks must be a non-empty list of integers >= 1",
         "give at least one cut-off k >= 1", api=_config_api("eval.ks=[]")),
    Case("config-int-beyond-64-bits", "API", "`--set data.synthetic.dim=100000000000000000000`",
         CrlValueError, "data.synthetic.dim: must fit in 64 bits", "give a realistic size",
         api=_config_api("data.synthetic.dim=100000000000000000000")),
    Case("unknown-config-regime", "API", "`--set negatives.regime=global`", CrlValueError,
         "negatives.regime: Input should be 'shared', 'independent' or 'in_batch'",
         "use one of the listed regimes", api=_config_api("negatives.regime=global")),
    Case("bad-set-syntax", "API", "`--set train.steps` (no `=`)", CrlValueError,
         "--set: expected KEY=VALUE with a dotted KEY", "write `--set train.steps=100`",
         api=_config_api("train.steps")),
    Case("batch-larger-than-data", "API", "`train.batch_size=128` with 64 training pairs",
         CrlValueError, "train.batch_size must be at most the number of training pairs n = 64",
         "lower train.batch_size or use more data",
         api=lambda tmp: lambda: __import__("crl.train", fromlist=["x"]).fit(
             _tiny("train.batch_size=128"), tmp / "run", progress=False)),
    Case("m-above-n-config", "API", "`negatives.m=1000` with 64 training pairs", CrlValueError,
         "negatives.m must be at most the number of training pairs n = 64",
         "lower negatives.m or use negatives.m_fraction",
         api=lambda tmp: lambda: __import__("crl.train", fromlist=["x"]).fit(
             _tiny("negatives.regime=shared", "negatives.m=1000"), tmp / "run",
             progress=False)),
    Case("matryoshka-repeated-dim", "API", "`--set loss.matryoshka.dims=[2, 2]`",
         CrlValueError, "loss.matryoshka: dims must be distinct; got [2, 2]",
         "list each prefix dimension once", api=_config_api("loss.matryoshka.dims=[2, 2]")),
    Case("matryoshka-dim-above-embedding", "API", "`loss.matryoshka.dims=[8, 1]` for "
         "2-dimensional embeddings", CrlValueError,
         "loss.matryoshka.dims must be at most the embedding dimension D = 2; got [8, 1]",
         "use prefix dimensions up to model.embed_dim",
         api=lambda tmp: lambda: __import__("crl.train", fromlist=["x"]).fit(
             _tiny("loss.matryoshka.dims=[8, 1]"), tmp / "run", progress=False)),
    # --- data files ---------------------------------------------------------------------------
    Case("missing-data-file", "API", "a `files` data path that does not exist",
         FileNotFoundError, "files: no such file", "check the path",
         api=_pairs_file(lambda tmp: tmp / "nothing.npz")),
    Case("empty-data-file", "API", "an empty `.jsonl` file", CrlValueError,
         "is empty", "write one JSON object per line with text fields a and b",
         api=_pairs_file(lambda tmp: _write(tmp / "empty.jsonl", b""))),
    Case("npz-without-a", "API", "a `.npz` without array `a`", CrlValueError,
         "missing array 'a'; the file holds ['b', 'x']",
         "save the arrays as `np.savez(path, a=..., b=...)`",
         api=_pairs_file(lambda tmp: _npz(tmp / "pairs.npz", b=np.ones((4, 2)),
                                          x=np.ones(3)))),
    Case("npz-not-a-zip", "API", "a `.npz` file that is not an npz archive", CrlValueError,
         "not a readable .npz file", "re-create the file with `np.savez`",
         api=_pairs_file(lambda tmp: _write(tmp / "pairs.npz", b"not a zip archive"))),
    Case("npz-nan", "API", "a `.npz` whose `b` holds a NaN", CrlValueError,
         "array 'b' has NaN or Inf values", "clean the data",
         api=_pairs_file(lambda tmp: _npz(tmp / "pairs.npz", a=np.ones((4, 2)),
                                          b=np.full((4, 2), np.nan)))),
    Case("npz-labels-wrong-length", "API", "a `.npz` with 4 pairs and 3 labels", CrlValueError,
         "labels must have one entry per pair, shape (4,); got shape (3,)",
         "give one label per pair",
         api=_pairs_file(lambda tmp: _npz(tmp / "pairs.npz", a=np.ones((4, 2)),
                                          b=np.ones((4, 2)), labels=np.arange(3)))),
    Case("jsonl-bad-line", "API", "a `.jsonl` whose line 3 is cut", CrlValueError,
         "line 3 is not valid JSON", "fix or delete that line", api=_pairs_file(_bad_jsonl)),
    Case("jsonl-missing-field", "API", "a `.jsonl` line without field `b`", CrlValueError,
         "has no column 'b' (set data.files.columns.b); its columns are ['a']",
         "give every line fields a and b (or name yours in data.files.columns)",
         api=_pairs_file(lambda tmp: _write(tmp / "pairs.jsonl", '{"a": "x"}\n'))),
    Case("unsupported-data-file", "API", "a `.xlsx` data file", CrlValueError,
         "files: unsupported file type '.xlsx'",
         "convert to .npz, .jsonl, .csv, .tsv or .parquet (docs/data.md)",
         api=_pairs_file(lambda tmp: _write(tmp / "pairs.xlsx", "a,b\n"))),
    Case("npz-zero-width", "API", "a `.npz` whose `a` and `b` have shape (200, 0)",
         CrlValueError, "array 'a' has shape (200, 0): vectors of 0 values",
         "save vectors of D >= 1 values per pair (it trained at chance before)",
         api=_pairs_file(bad.zero_width_npz)),
    Case("pycode-no-python-files", "API", "a pycode source root with no `.py` files",
         CrlValueError, "holds no Python (.py) files", "point data.pycode.roots at source code",
         api=_empty_python_root),
    # --- run directories and checkpoints -----------------------------------------------------
    Case("run-dir-of-another-config", "API", "`fit(config, run_dir, resume=True)` where the "
         "checkpoint was written by another config", StaleRunError, "belongs to config",
         "resume with the config in run_dir/config.json, or choose another output directory "
         "(a study starts such a run over)",
         api=_fit_resume("optim.lr=0.5")),
    Case("finished-run-of-another-config", "API", "`fit(..., resume=True)` on a finished run of "
         "another config", StaleRunError, "holds the finished run",
         "choose another output directory", api=_fit_resume("optim.lr=0.5", finished=True)),
    Case("truncated-checkpoint", "API", "`fit(..., resume=True)` with a checkpoint cut to half",
         CrlError, "is truncated or corrupt", "delete checkpoint.pt to start the run over",
         api=_damaged_checkpoint(lambda data: data[: len(data) // 2])),
    Case("corrupt-checkpoint", "API", "`fit(..., resume=True)` with 64 flipped bytes in the "
         "checkpoint", CrlError, "is truncated or corrupt",
         "delete checkpoint.pt to start the run over", api=_damaged_checkpoint(_flip_middle)),
    Case("checkpoint-runs-code", "API", "`fit(..., resume=True)` with a checkpoint whose pickle "
         "would create a file when loaded", CrlError,
         "holds objects other than tensors and plain values (Unsupported global: GLOBAL io.open)",
         "delete it: it was not written by crl (nothing in it ran)", api=_fit_hostile),
    Case("unknown-study", "API", "`get_study(\"negative\")`", CrlValueError,
         "crl study: unknown study 'negative'; valid values are 'negatives'",
         "use one of the listed studies",
         api=lambda _: lambda: __import__("crl.experiments.registry", fromlist=["x"]).get_study(
             "negative")),
    # --- the command line -----------------------------------------------------------------------
    Case("cli-unknown-preset", "CLI", "`crl train digits-simclr2`", CrlValueError,
         "error: load_config: CONFIG must be a YAML file or a preset name",
         "use a YAML file or a listed preset",
         cli=lambda tmp: ["train", "digits-simclr2", "--out", str(tmp / "runs")]),
    Case("cli-unknown-key", "CLI", "`crl train ... --set trian.steps=3`", CrlValueError,
         "trian: unknown key; valid keys here: data, model, loss", "fix the key",
         cli=_cli_train("--set", "trian.steps=3")),
    Case("cli-malformed-yaml", "CLI", "`crl train run.yaml` with malformed YAML",
         CrlValueError, "not valid YAML", "fix the YAML (indentation, colons)",
         cli=lambda tmp: ["train", str(_write(tmp / "run.yaml", "train: [steps: 3\n")),
                          "--out", str(tmp / "runs")]),
    Case("cli-jsonl-bad-line", "CLI", "`crl train` on a `.jsonl` data file whose line 3 is cut",
         CrlValueError, "line 3 is not valid JSON", "fix or delete that line",
         cli=_cli_files(_bad_jsonl)),
    Case("cli-missing-data-file", "CLI", "`crl train` on a data file that does not exist",
         FileNotFoundError, "files: no such file", "check data.files.path",
         cli=_cli_files(lambda tmp: tmp / "nothing.npz")),
    Case("cli-yaml-nested-aliases", "CLI", "`crl train bomb.yaml`: 1.3 kB of nested YAML "
         "aliases that stand for 387 million values (a 'billion laughs')", CrlValueError,
         "the YAML holds more than 100,000 values once its aliases (*name) are expanded",
         "write the values out; nothing of the document is quoted",
         cli=lambda tmp: ["train", str(bad.laughs_yaml(tmp)), "--out", str(tmp / "runs")]),
    Case("cli-yaml-too-deep", "CLI", "`crl train deep.yaml` with lists nested 5,000 deep",
         CrlValueError, "the YAML nests deeper than 64 levels", "flatten the config",
         cli=lambda tmp: ["train", str(bad.deep_yaml(tmp)), "--out", str(tmp / "runs")]),
    Case("cli-jsonl-nested-deep", "CLI", "`crl train` on a `.jsonl` whose line 25 nests "
         "arrays 200,000 deep", CrlValueError,
         "line 25 nests its JSON deeper than the parser can follow",
         "give one flat JSON object per line", cli=_cli_files(bad.nested_jsonl)),
    Case("cli-jsonl-not-utf8", "CLI", "`crl train` on a `.jsonl` with a Latin-1 byte on line "
         "25", CrlValueError, "is not UTF-8 text: line 25 holds the byte 0xe9",
         "save the file as UTF-8 (`iconv -f latin1 -t utf-8`)",
         cli=_cli_files(bad.latin1_jsonl)),
    Case("cli-encode-not-utf8", "CLI", "`crl encode RUN_DIR texts.jsonl --out x.npy` with a "
         "Latin-1 byte in the texts", CrlValueError, "texts.jsonl is not UTF-8 text: line 25",
         "save the file as UTF-8",
         cli=lambda tmp: ["encode", str(bad.text_run(tmp)),
                          str(bad.latin1_jsonl(tmp, "texts.jsonl")), "--out",
                          str(tmp / "x.npy"), "--no-progress"]),
    Case("cli-jsonl-gzip", "CLI", "`crl train` on gzip-compressed pairs named `pairs.jsonl`",
         CrlValueError, "pairs.jsonl is gzip-compressed, not text",
         "decompress it (`gunzip -c pairs.jsonl > plain.jsonl`)",
         cli=_cli_files(bad.gzip_jsonl)),
    Case("cli-npz-zero-width", "CLI", "`crl train` on a `.npz` whose `a` and `b` have shape "
         "(200, 0)", CrlValueError, "has shape (200, 0): vectors of 0 values",
         "save vectors of D >= 1 values", cli=_cli_files(bad.zero_width_npz)),
    Case("cli-pretrained-pickle", "CLI", "`crl train` with `model.pretrained` a directory whose "
         "`pytorch_model.bin` pickle would call `os.system`", CrlValueError,
         "pytorch_model.bin holds objects other than tensors (Unsupported global: GLOBAL "
         "posix.system): pickled code or objects, which crl refuses to load",
         "use a model saved as model.safetensors, from a source you trust (nothing ran)",
         cli=_cli_pretrained(bad.pickled_pretrained)),
    Case("cli-pretrained-truncated", "CLI", "`crl train` with `model.pretrained` a directory "
         "whose `model.safetensors` is cut to half", CrlValueError,
         "offline (SafetensorError: Error while deserializing header",
         "re-save or copy the model again", cli=_cli_pretrained(bad.truncated_safetensors)),
    Case("cli-max-seq-length-over-positions", "CLI", "`crl train` on a tiny BERT of 64 "
         "positions with `model.max_seq_length=128`", CrlValueError,
         "model.max_seq_length: must be at most the model's 64 positions",
         "give a max_seq_length the model was trained for (its max_position_embeddings)",
         cli=lambda tmp: [*_cli_pretrained(_tiny_bert)(tmp), "--set",
                          "model.max_seq_length=128"]),
    Case("cli-micro-batch-tokens-no-tokens", "CLI", "`crl train synthetic-gaussian "
         "--micro-batch-tokens 100` (vectors, no tokens to count)", CrlValueError,
         "train.micro_batch_tokens: needs token inputs (n, 2, L) of ids and attention mask",
         "use train.micro_batch_size instead",
         cli=_cli_train("--micro-batch-tokens", "100")),
    Case("cli-unwritable-out", "CLI", "`crl train ... --out DIR` where DIR cannot be created "
         "(below a regular file)", NotADirectoryError, "Not a directory; check the path",
         "choose a writable --out",
         cli=lambda tmp: _cli_train("--out", str(_under_a_file(tmp)))(tmp)),
    Case("cli-existing-run", "CLI", "`crl train` again into an interrupted run without "
         "`--resume`", CrlError, "already holds", "add --resume, or choose another --out",
         cli=_cli_existing_run),
    Case("cli-truncated-checkpoint", "CLI", "`crl train ... --resume` with a truncated "
         "checkpoint", CrlError, "is truncated or corrupt", "delete checkpoint.pt",
         cli=_cli_truncated_checkpoint),
    Case("cli-hostile-checkpoint", "CLI", "`crl eval RUN_DIR` with a checkpoint whose pickle "
         "would create a file when loaded", CrlError,
         "holds objects other than tensors and plain values", "delete it (nothing in it ran)",
         cli=lambda tmp: ["eval", str(_hostile_run(tmp))]),
    Case("cli-shell-checkpoint", "CLI", "`crl eval RUN_DIR` with a checkpoint whose pickle "
         "would call `os.system`", CrlError,
         "(Unsupported global: GLOBAL posix.system): pickled code or objects, which crl "
         "refuses to load", "delete it (nothing in it ran); never load it with "
         "weights_only=False", cli=lambda tmp: ["eval", str(_shell_checkpoint_run(tmp))]),
    Case("cli-shell-pickle", "CLI", "`crl eval RUN_DIR` with a `checkpoint.pt` that is a bare "
         "pickle (protocol 5) calling `os.system`", CrlError,
         "(Unsupported global: GLOBAL posix.system): pickled code or objects",
         "delete it (nothing in it ran)",
         cli=lambda tmp: ["eval", str(_shell_checkpoint_run(tmp, protocol=5))]),
    Case("cli-bad-option-value", "CLI", "`crl train ... --nproc two` (any option of the wrong "
         "type)", typer.BadParameter, "crl train: Invalid value for '--nproc'",
         "give an integer; the line ends with where the help is", cli=_cli_train("--nproc", "two")),
    Case("cli-missing-argument", "CLI", "`crl eval` without RUN_DIR", typer.BadParameter,
         "crl eval: Missing argument", "give the argument (`crl eval --help`)",
         cli=lambda tmp: ["eval"]),
    Case("cli-unknown-study-preset", "CLI", "`crl study negatives --preset huge`",
         CrlValueError, "unknown preset 'huge'; valid presets are 'smoke', 'quick', 'full'",
         "use smoke, quick or full",
         cli=lambda tmp: ["study", "negatives", "--preset", "huge", "--out", str(tmp)]),
    Case("cli-study-bad-data", "CLI", "`crl study negatives --data pairs.xlsx`", CrlValueError,
         "`--data` must be one of pycode, digits, synthetic, a .npz/",
         "use a named data set or a file `crl train` reads", cli=_study("--data", "pairs.xlsx")),
    Case("cli-study-workers-zero", "CLI", "`crl study negatives --workers 0`", CrlValueError,
         "--workers must be an integer >= 1; got 0", "use --workers 1 or more",
         cli=_study("--workers", "0")),
    Case("cli-study-unwritable-out", "CLI", "`crl study negatives --out DIR` where DIR cannot "
         "be created", CrlValueError, "cannot write the study directory",
         "choose a writable --out",
         cli=lambda tmp: _study("--out", str(_under_a_file(tmp)))(tmp)),
    Case("cli-study-tolerance-negative", "CLI", "`crl study negatives --tolerance -1`",
         CrlValueError, "study negatives: `--tolerance`: must be a number of points of the metric"
         " >= 0 (e.g. 0.01) or a percentage of the best below 100% (e.g. 2%); got '-1'",
         "use a tolerance >= 0 in the metric's units, or a percentage (nothing trained)",
         cli=_study("--tolerance", "-1")),
    Case("cli-study-tolerance-nan", "CLI", "`crl study negatives --tolerance nan`",
         CrlValueError, "`--tolerance`: must be a number of points of the metric >= 0 "
         "(e.g. 0.01) or a percentage of the best below 100% (e.g. 2%); got 'nan'",
         "use a finite tolerance such as 0.01", cli=_study("--tolerance", "nan")),
    Case("cli-study-target-epochs-zero", "CLI", "`crl study negatives --target-epochs 0`",
         CrlValueError, "study negatives: `--target-epochs`: input should be greater than 0; "
         "got 0.0", "plan a positive number of epochs (nothing trained)",
         cli=_study("--target-epochs", "0")),
    Case("cli-study-epochs-and-samples", "CLI", "`crl study negatives --target-epochs 2 "
         "--target-samples 5000`", CrlValueError,
         "give `--target-epochs` or `--target-samples` (`--budget`), not both; got 2 epochs and "
         "5,000 samples", "state the training one way", cli=_study(
             "--target-epochs", "2", "--target-samples", "5000")),
    Case("cli-study-control-n-unswept", "CLI", "`crl study negatives --control --control-n 100`"
         " (not a swept n)", CrlValueError,
         "`--control-n` must be one of the swept n [64, 128, 512]; got 100",
         "use one of --ns", cli=_study("--control", "--control-n", "100")),
    Case("cli-study-verify-seeds-two", "CLI", "`crl study negatives --verify --verify-seeds 2`",
         CrlValueError, "study negatives: `--verify-seeds`: input should be greater than or "
         "equal to 3; got 2", "verify with 3 seeds or more (default 5; nothing trained)",
         cli=_study("--verify", "--verify-seeds", "2")),
    Case("cli-study-compare-not-a-study", "CLI", "`crl study compare A B` where B is not a "
         "study directory", CrlValueError, "has no study.json; pass directories `crl study "
         "negatives` wrote", "pass two negatives study directories",
         cli=lambda tmp: ["study", "compare", str(tmp), str(tmp / "missing")]),
    Case("cli-report-tolerance-text", "CLI", "`crl report DIR` whose `study.json` holds "
         "`\"tolerance\": \"x\"`", CrlValueError,
         "study.json: options.tolerance: must be a number of points of the metric >= 0 (e.g. 0.0"
         "1) or a percentage of the best below 100% (e.g. 2%); got 'x'",
         "write a number (or re-run the study)",
         cli=_report_on({"data": "synthetic", "tolerance": "x"})),
    Case("cli-report-tolerance-negative", "CLI", "`crl report DIR` whose `study.json` holds "
         "`\"tolerance\": -1`", CrlValueError,
         "study.json: options.tolerance: must be a number of points of the metric >= 0 (e.g. 0.0"
         "1) or a percentage of the best below 100% (e.g. 2%); got -1",
         "write a tolerance >= 0", cli=_report_on({"data": "synthetic", "tolerance": -1})),
    Case("cli-report-unknown-option", "CLI", "`crl report DIR` whose `study.json` has an "
         "unknown option `tolerence`", CrlValueError,
         "study.json: options.tolerence: unknown option; valid options: data, config, model",
         "use one of the listed options", cli=_report_on({"data": "synthetic",
                                                           "tolerence": 0.01})),
    Case("cli-report-unknown-key", "CLI", "`crl report DIR` whose `study.json` has an unknown "
         "top-level key", CrlValueError,
         "study.json: colour: unknown key; valid keys: study, preset, options",
         "remove the key", cli=_report_on({"data": "synthetic"}, colour="red")),
    Case("cli-report-from-results-missing", "CLI", "`crl report DIR --from-results` on a study "
         "directory without `results.csv`", CrlValueError,
         "--from-results reads", "rebuild from the run directories, or restore results.csv",
         cli=lambda tmp: [*_report_on({"data": "synthetic"})(tmp), "--from-results"]),
    Case("cli-report-not-a-study", "CLI", "`crl report DIR` on a directory that is not a study",
         CrlValueError, "is not a study directory (no study.json)",
         "pass the directory `crl study` wrote",
         cli=lambda tmp: ["report", str(_write(tmp / "x" / "notes.txt", "x").parent)]),
    Case("cli-eval-not-a-run", "CLI", "`crl eval DIR` on a directory that is not a run",
         CrlError, "is not a run directory (no config.json)", "pass a run directory",
         cli=lambda tmp: ["eval", str(_write(tmp / "x" / "notes.txt", "x").parent)]),
    Case("cli-eval-planted-factory", "CLI", "`crl eval RUN_DIR` whose `config.json` names "
         "`model.kind: custom, factory: evilmod:build`", CrlValueError,
         "names code to run (model.factory 'evilmod:build'); crl imports a run directory's "
         "factory only when you name it: pass --trust-factory evilmod:build",
         "pass `--trust-factory evilmod:build` only if you trust that module (nothing ran)",
         cli=_cli_planted_factory),
    Case("cli-train-locked-run", "CLI", "`crl train ... --resume` into a run directory another "
         "live crl process is writing", CrlError,
         "is being written by another crl process (pid",
         "wait for that process to finish, or choose another --out", cli=_cli_locked_run),
    Case("cli-study-linked-run", "CLI", "`crl study` into a study directory whose run directory "
         "is a symbolic link to a directory elsewhere", CrlError,
         "is a symbolic link (to ", "remove the link, or choose another --out (nothing written)",
         cli=_cli_study_linked_run),
    Case("cli-study-other-options", "CLI", "`crl study` into a directory whose `study.json` "
         "records other options, without `--force`", CrlValueError,
         "holds a study with other options (preset 'quick' there, 'smoke' now",
         "re-run with its own options, choose another --out, or pass --force",
         cli=_cli_study_other_options),
    Case("cli-study-batch-not-in-batch", "CLI", "`crl study batch --config gcl.yaml` (a loss "
         "without in-batch negatives)", CrlValueError,
         "loss.name must be an in-batch loss (clip, info_nce, dcl, siglip) for a batch-size "
         "sweep; got 'gcl'", "train with an in-batch loss, or sweep m with `crl study negatives`"
         " (nothing trained)",
         cli=lambda tmp: ["study", "batch", "--out", str(tmp), "--config", str(_write(
             tmp / "gcl.yaml", "data: {name: synthetic}\nmodel: {kind: linear}\n"
             "loss: {name: gcl}\n"))]),
    Case("cli-encode-out-directory", "CLI", "`crl encode RUN_DIR texts.jsonl --out DIR` where DIR "
         "is an existing directory", CrlValueError, "is a directory; give the .npy file to write",
         "give a file name such as DIR/embeddings.npy", cli=_cli_encode_into_a_directory),
    Case("cli-eval-config-not-utf8", "CLI", "`crl eval RUN_DIR` whose `config.json` holds a "
         "Latin-1 byte (found by the run-directory fuzz)", CrlValueError,
         "config.json: not UTF-8 text (byte 0xe9 at offset ",
         "delete the damaged run directory or re-run it", cli=_cli_eval_latin1_config),
    Case("cli-eval-missing-qrels", "CLI", "`crl eval --model minilm --beir DIR --qrels FILE` "
         "where FILE does not exist", CrlValueError,
         "does not exist (expected a qrels file: BEIR's TSV",
         "give the judgements of DIR (default DIR/qrels/<split>.tsv; nothing loaded)",
         cli=_cli_eval_beir("--qrels", "TMP/missing.tsv")),
    Case("cli-eval-qrels-unknown-id", "CLI", "`crl eval --model minilm --beir DIR` whose qrels "
         "name a document that is not in `corpus.jsonl`", CrlValueError,
         "the qrels name 1 corpus id(s) that are not in the corpus (first: ['d404'])",
         "fix the ids, or add the documents to corpus.jsonl",
         cli=_cli_eval_beir(qrels="query-id\tcorpus-id\tscore\nq1\td404\t1\n")),
    Case("cli-eval-ks-zero", "CLI", "`crl eval --model minilm --beir DIR --ks 0,10`",
         CrlValueError, "eval: --ks must be comma-separated integers >= 1 (e.g. 1,10,100); "
         "got '0,10'", "give cut-offs >= 1", cli=_cli_eval_beir("--ks", "0,10")),
    Case("ir-metrics-k-zero", "API", "`crl.eval.ir_metrics(queries, corpus, relevance, "
         "ks=(0,))`", CrlValueError, "ir_metrics: `ks[...]` must be in >= 1; got 0",
         "use cut-offs >= 1",
         api=lambda _: lambda: __import__("crl.eval", fromlist=["ir_metrics"]).ir_metrics(
             torch.eye(2), torch.eye(2), __import__("crl.eval", fromlist=["Relevance"])
             .Relevance.pairs(2), ks=(0,))),
    Case("cli-report-study-json-nested-deep", "CLI", "`crl report DIR` whose `study.json` nests "
         "arrays 100,000 deep (found by the run-directory fuzz)", CrlValueError,
         "study.json: nests its JSON deeper than the parser can follow",
         "delete study.json and re-run the study",
         cli=lambda tmp: ["report", str(_write(tmp / "negatives" / "study.json",
                                               "[" * 100_000 + "]" * 100_000).parent)]),
    Case("cli-mine-bad-model", "CLI", "`crl mine pairs.jsonl --model nowhere --out m.jsonl` "
         "where `nowhere` does not exist", CrlValueError,
         "--model: expected 'minilm', a run directory written by crl train",
         "give minilm, a run directory or a sentence-transformers directory",
         cli=lambda tmp: ["mine", str(bad.good_jsonl(tmp)), "--model", str(tmp / "nowhere"),
                          "--out", str(tmp / "m.jsonl")]),
    Case("cli-mine-out-type", "CLI", "`crl mine pairs.jsonl --model minilm --out m.xlsx`",
         CrlValueError, "mine: --out must be a .jsonl, .csv, .tsv, .parquet file",
         "name a .jsonl, .csv, .tsv or .parquet file",
         cli=lambda tmp: ["mine", str(bad.good_jsonl(tmp)), "--model", "minilm", "--out",
                          str(tmp / "m.xlsx")]),
    Case("cli-mine-range", "CLI", "`crl mine ... --range-min 5 --range-max 5`", CrlValueError,
         "mine: `range_min` must be smaller than `range_max`; got range_min=5, range_max=5",
         "raise --range-max or lower --range-min",
         cli=lambda tmp: ["mine", str(bad.good_jsonl(tmp)), "--model", "minilm", "--out",
                          str(tmp / "m.jsonl"), "--range-min", "5", "--range-max", "5"]),
    Case("cli-guide-vectors", "CLI", "`crl train synthetic-gaussian --set "
         "loss.guide.model=minilm` (a guide on vector data)", CrlValueError,
         "loss.guide needs text pairs (its model scores texts)", "remove loss.guide",
         cli=_cli_train("--set", "loss.guide.model=minilm")),
    Case("cli-guide-bad-model", "CLI", "`crl train` on pairs with `loss.guide.model` a path "
         "that does not exist", CrlValueError,
         "loss.guide.model: expected 'minilm', a run directory written by crl train",
         "give minilm, a run directory or a sentence-transformers directory",
         cli=lambda tmp: _cli_train(
             "--set", "data.name=files", "--set", f"data.files.path={bad.good_jsonl(tmp)}",
             "--set", "data.num_train=null", "--set", "model.kind=embedding_bag",
             "--set", "loss.guide.model={tmp}/nowhere")(tmp)),
]

# ----------------------------------------------------------------------------- the tests


def _tree(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder`` (directories as "dir")."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        out[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _fresh(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """What changed between two trees (new, removed or modified paths)."""
    keys = set(before) | set(after)
    return {k: f"{before.get(k)} -> {after.get(k)}" for k in sorted(keys)
            if before.get(k) != after.get(k)}


API_CASES = [c for c in CASES if c.where == "API"]
CLI_CASES = [c for c in CASES if c.where == "CLI"]


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_api_bad_input(case: Case, tmp_path: Path) -> None:
    assert case.api is not None
    call = case.api(tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(case.error) as info:
        call()
    assert type(info.value) is case.error or issubclass(type(info.value), case.error)
    message = str(info.value)
    assert case.message in message, message
    assert isinstance(info.value, (CrlError, OSError)), type(info.value)
    assert _fresh(before, _tree(tmp_path)) == {}, "existing files were changed"


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_cli_bad_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crl.cli import app

    assert case.cli is not None
    # "0" is off; monkeypatch restores the variable that `crl --debug` below sets in-process.
    monkeypatch.setenv("CRL_DEBUG", "0")
    args = case.cli(tmp_path)
    before = _tree(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert case.message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert _fresh(before, _tree(tmp_path)) == {}, "existing files were changed"
    # With --debug the error itself propagates (so its traceback is printed).
    debug = CliRunner().invoke(app, ["--debug", *args])
    assert isinstance(debug.exception, case.error), debug.output
    assert debug.exit_code != 0 and debug.exc_info is not None and debug.exc_info[2] is not None
    assert _fresh(before, _tree(tmp_path)) == {}, "existing files were changed (--debug)"


def test_cli_debug_shows_a_traceback(tmp_path: Path) -> None:
    """Through a real process: one ``error:`` line by default, the traceback with --debug."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "CRL_DEBUG"}
    command = [sys.executable, "-m", "crl", "train", "synthetic-gaussian", "--set",
               "train.stepz=3", "--out", str(tmp_path)]
    plain = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert plain.returncode == 2
    assert plain.stderr.startswith("error: ") and len(plain.stderr.splitlines()) == 1
    debug = subprocess.run([*command[:3], "--debug", *command[3:]], capture_output=True,
                           text=True, env=env, check=False)
    assert debug.returncode != 0 and "Traceback (most recent call last)" in debug.stderr
    assert "CrlValueError" in debug.stderr and "train.stepz: unknown key" in debug.stderr


# ----------------------------------------------------------------------------- the table

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
TABLE_HEADER = ("| case | where | input | error | message contains | fix |\n"
                "| --- | --- | --- | --- | --- | --- |")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table() -> str:
    """The table of ``docs/errors.md``, generated from :data:`CASES`."""
    rows = [TABLE_HEADER]
    for c in CASES:
        rows.append(f"| `{c.id}` | {c.where} | {_cell(c.input)} | `{c.error.__name__}` | "
                    f"`` {_cell(c.message)} `` | {_cell(c.fix)} |")
    return "\n".join(rows) + "\n"


def test_docs_table_lists_exactly_these_cases() -> None:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(TABLE_HEADER)
    end = text.find("\n\n", start)
    table = text[start:] if end < 0 else text[start:end + 1]
    assert table == markdown_table(), (
        "docs/errors.md is out of date: regenerate the table with "
        "`PYTHONPATH=tests python tests/robustness/test_robustness_bad_input.py`")
    ids = re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.MULTILINE)
    assert ids == [c.id for c in CASES] and len(ids) == len(set(ids)) >= 30


def test_docs_and_readme_quote_the_number_of_cases() -> None:
    count = f"{len(CASES)} cases"
    assert count in DOC.read_text(encoding="utf-8"), f"docs/errors.md must say {count!r}"
    readme = DOC.parents[1] / "README.md"
    assert count in readme.read_text(encoding="utf-8"), f"README.md must say {count!r}"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())


def test_debug_does_not_leak_into_later_in_process_invocations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crl.cli import app

    monkeypatch.setenv("CRL_DEBUG", "0")
    monkeypatch.delenv("CRL_DEBUG")  # absent, and restored by monkeypatch afterwards
    args = ["train", "digits-simclr2", "--out", str(tmp_path)]
    assert isinstance(CliRunner().invoke(app, ["--debug", *args]).exception, CrlValueError)
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 2 and plain.stderr.startswith("error: ")
    assert "CRL_DEBUG" not in os.environ
    monkeypatch.setenv("CRL_DEBUG", "1")  # exported by the user: kept
    assert isinstance(CliRunner().invoke(app, args).exception, CrlValueError)
    assert os.environ["CRL_DEBUG"] == "1"
