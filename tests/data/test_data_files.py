"""User files: .npz and .jsonl pairs, and one test per error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from crl.data import DataConfig, load_data
from crl.data.files import load_pair_file
from crl.errors import CrlValueError


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_npz_pairs_with_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(40, 3)), rng.normal(size=(40, 5))
    labels = np.arange(40) % 4
    path = _npz(tmp_path / "pairs.npz", a=a, b=b, labels=labels)
    ds, provenance = load_pair_file(path)
    assert torch.allclose(ds.a, torch.tensor(a, dtype=torch.float32))
    assert ds.labels is not None and ds.labels.tolist() == labels.tolist()
    assert provenance["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    splits = load_data(DataConfig(name="files", files={"path": str(path)}))
    assert (splits.info.kind, splits.info.dim_a, splits.info.dim_b) == ("vector", 3, 5)
    assert splits.info.num_classes == 4
    assert len(splits.train) + len(splits.val) + len(splits.test) == 40


def test_jsonl_text_pairs(tmp_path: Path) -> None:
    lines = [json.dumps({"a": f"query {i}", "b": f"doc {i}", "label": i % 2}) for i in range(10)]
    path = _jsonl(tmp_path / "pairs.jsonl", [*lines[:5], "", *lines[5:]])  # blank lines are ok
    ds, _ = load_pair_file(path)
    assert ds.is_text and len(ds) == 10 and ds[3][:2] == ("query 3", "doc 3")
    assert ds.labels is not None and ds.labels.tolist() == [i % 2 for i in range(10)]
    splits = load_data(DataConfig(name="files", files={"path": str(path)}, test_fraction=0.2))
    assert splits.info.kind == "text" and len(splits.test) == 2


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.npz"):
        load_pair_file(tmp_path / "absent.npz")


def test_missing_path_in_config() -> None:
    with pytest.raises(CrlValueError, match=r"files\.path"):
        load_data(DataConfig(name="files"))


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(CrlValueError, match="empty"):
        load_pair_file(tmp_path / "e.jsonl")
    _jsonl(tmp_path / "blank.jsonl", ["", "  "])
    with pytest.raises(CrlValueError, match="no pairs"):
        load_pair_file(tmp_path / "blank.jsonl")


def test_unknown_extension_lists_supported(tmp_path: Path) -> None:
    (tmp_path / "x.xlsx").write_text("a,b\n")
    with pytest.raises(CrlValueError, match=r"'\.xlsx'.*\.npz, \.jsonl, \.csv, \.tsv, \.parquet"):
        load_pair_file(tmp_path / "x.xlsx")


def test_npz_missing_array_names_keys(tmp_path: Path) -> None:
    path = _npz(tmp_path / "p.npz", x=np.zeros((3, 2)), b=np.zeros((3, 2)))
    with pytest.raises(CrlValueError, match=r"missing array 'a'.*\['b', 'x'\]"):
        load_pair_file(path)


def test_npz_mismatched_lengths(tmp_path: Path) -> None:
    path = _npz(tmp_path / "p.npz", a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    with pytest.raises(CrlValueError, match="3 and 4"):
        load_pair_file(path)


def test_npz_labels_wrong_length(tmp_path: Path) -> None:
    path = _npz(tmp_path / "p.npz", a=np.zeros((3, 2)), b=np.zeros((3, 2)), labels=np.zeros(2))
    with pytest.raises(CrlValueError, match=r"labels.*\(3,\).*\(2,\)"):
        load_pair_file(path)


def test_npz_bad_arrays(tmp_path: Path) -> None:
    with pytest.raises(CrlValueError, match="2-D"):
        load_pair_file(_npz(tmp_path / "p.npz", a=np.zeros(3), b=np.zeros((3, 2))))
    with pytest.raises(CrlValueError, match="NaN"):
        load_pair_file(_npz(tmp_path / "q.npz", a=np.full((3, 2), np.nan), b=np.zeros((3, 2))))
    with pytest.raises(CrlValueError, match="integers"):
        load_pair_file(_npz(tmp_path / "r.npz", a=np.zeros((3, 2)), b=np.zeros((3, 2)),
                            labels=np.array([0.5, 1, 2])))


def test_jsonl_bad_line_reports_line_number(tmp_path: Path) -> None:
    good = json.dumps({"a": "x", "b": "y"})
    with pytest.raises(CrlValueError, match="line 3 is not valid JSON"):
        load_pair_file(_jsonl(tmp_path / "p.jsonl", [good, good, "{not json"]))
    with pytest.raises(CrlValueError, match="line 2, column 'b': expected text, found nothing"):
        load_pair_file(_jsonl(tmp_path / "q.jsonl", [good, json.dumps({"a": "x", "c": 1})]))
    with pytest.raises(CrlValueError, match="line 1 must be a JSON object"):
        load_pair_file(_jsonl(tmp_path / "r.jsonl", ["[1, 2]"]))
    with pytest.raises(CrlValueError, match="line 2, column 'label': expected an integer"):
        load_pair_file(_jsonl(tmp_path / "s.jsonl",
                              [json.dumps({"a": "x", "b": "y", "label": 1}), good]))
    with pytest.raises(CrlValueError, match=r"line 1, column 'label': expected an integer.*'cat'"):
        load_pair_file(_jsonl(tmp_path / "t.jsonl", [json.dumps({"a": "x", "b": "y",
                                                                 "label": "cat"})]))


def test_negative_labels_rejected(tmp_path: Path) -> None:
    path = _npz(tmp_path / "p.npz", a=np.zeros((4, 2)), b=np.zeros((4, 2)),
                labels=np.array([0, -1, 1, 0]))
    with pytest.raises(CrlValueError, match="non-negative"):
        load_data(DataConfig(name="files", files={"path": str(path)}))


def test_hard_negatives_survive_an_empty_split() -> None:
    """A split with no pairs (e.g. data.val_fraction=0) of a file with hard negatives is an empty
    data set, not an error; the non-empty subsets keep their H."""
    from crl.data.base import TextPairDataset

    ds = TextPairDataset(["q1", "q2"], ["d1", "d2"], negatives=[["n1"], ["n2"]])
    empty = ds.subset([])
    assert len(empty) == 0
    assert ds.subset([1]).num_hard_negatives == 1
    with pytest.raises(CrlValueError, match="lists of the same number"):
        TextPairDataset(["q1", "q2"], ["d1", "d2"], negatives=[["n1"], []])
