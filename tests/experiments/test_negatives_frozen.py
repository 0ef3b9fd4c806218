"""A negatives study of a pretrained transformer with frozen lower layers: the quick preset's
grid for a transformer (``grid.preset_grid``: its documented rule, stated in the report), the
report and ``analysis.json`` naming the pretrained model and what was frozen, and the
short-against-long description file built from what a Debian machine has installed
(:mod:`crl.data.descriptions`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml
from test_experiments_negatives_cli import _text_pairs, smoke_study

from crl.data.descriptions import man_page_pair, write_description_pairs
from crl.errors import CrlValueError
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.grid import GRIDS, TRANSFORMER_GRIDS

STATUS = """Package: adduser
Status: install ok installed
Description: add and remove users and groups
 This package includes the 'adduser' and 'deluser' commands.
 .
 Adding users with 'adduser' is much easier.
Homepage: https://example.org

Package: nodesc
Version: 1

Package: bash
Description: GNU Bourne Again SHell
 Bash is an sh-compatible command language interpreter.
"""
PAGE = """.TH LS 1
.SH NAME
ls \\- list directory contents
.SH SYNOPSIS
.B ls
[\\fIOPTION\\fR]...
.SH DESCRIPTION
.\\" a comment
List information about the FILEs (the current directory by default). Sort entries
alphabetically if none of
.B \\-cftuvSUX
nor \\fB\\-\\-sort\\fP is specified, in the order of their names in each directory.
.SH AUTHOR
Someone.
"""


def _config(tmp_path: Path, tiny_bert: Path, freeze: int = 1) -> Path:
    data = _text_pairs(tmp_path / "pairs.jsonl", count=200)
    config = {"data": {"name": "files", "files": {"path": str(data)}},
              "model": {"kind": "transformer", "pretrained": str(tiny_bert), "head": "none",
                        "max_seq_length": 16, "freeze_layers": freeze},
              "loss": {"name": "clip"}, "optim": {"lr": 1e-3}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_quick_preset_of_a_transformer_follows_its_rule(tmp_path: Path,
                                                            tiny_bert: Path) -> None:
    study = NegativesStudy("quick", config=str(_config(tmp_path, tiny_bert)))
    assert study.grid == TRANSFORMER_GRIDS["quick"] and study.grid.refine_runs == 0
    assert study.grid_rule is not None and "512 samples per run" in study.grid_rule
    assert "benchmarks/frozen.py" in study.grid_rule
    own = NegativesStudy("quick", data=str(tmp_path / "pairs.jsonl"))  # a bag of tokens
    assert own.grid == GRIDS["files"]["quick"] and own.grid_rule is None
    smoke = NegativesStudy("smoke", config=str(tmp_path / "run.yaml"))
    assert smoke.grid == GRIDS["files"]["smoke"] and smoke.grid_rule is None
    bigger = NegativesStudy("quick", config=str(tmp_path / "run.yaml"), budget=2048)
    assert bigger.grid.budget == 2048  # the flags still override the preset's grid


def test_the_report_names_the_model_and_what_was_frozen(tmp_path: Path,
                                                        tiny_bert: Path) -> None:
    study_dir = smoke_study(_config(tmp_path, tiny_bert), tmp_path / "s")
    facts = json.loads((study_dir / "data.json").read_text())["pretrained"]
    assert facts["path"] == str(tiny_bert) and facts["name"] == tiny_bert.name
    assert (facts["layers"], facts["frozen_layers"], facts["trained_layers"]) == (2, 1, 1)
    assert facts["frozen_cached"] is True and facts["model_type"] == "bert"
    words = json.loads((study_dir / "data.json").read_text())["frozen"]
    assert "the embeddings and layer 1 frozen (computed once per text and cached)" in words
    numbers = json.loads((study_dir / "analysis.json").read_text())["numbers"]
    assert numbers["pretrained"] == facts and numbers["grid_rule"] is None
    page = (study_dir / "report.html").read_text()
    assert (f"Pretrained model {tiny_bert.name} (2 layers): the embeddings and layer 1 frozen "
            "(computed once per text and cached), layer 2 trained.") in page


def test_description_pairs_from_dpkg_and_manual_pages(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS)
    man = tmp_path / "man" / "man1"
    man.mkdir(parents=True)
    (man / "ls.1.gz").write_bytes(gzip.compress(PAGE.encode()))
    (man / "dir.1.gz").write_bytes(gzip.compress(b".so man1/ls.1\n"))  # an alias
    for i in range(3):  # one family: at most 2 of its pages (per_family in the call below)
        (man / f"tool-sub{i}.1").write_text(PAGE.replace("list directory contents",
                                                         f"sub-command {i}").replace(
            "List information", f"Sub-command {i} lists information"))
    assert man_page_pair(man / "dir.1.gz") is None
    short, long = man_page_pair(man / "ls.1.gz") or ("", "")
    assert short == "list directory contents"
    assert long.startswith("List information about the FILEs")
    assert "-cftuvSUX nor --sort is specified" in long
    out = tmp_path / "pairs.jsonl"
    assert write_description_pairs(out, status=status, man_root=tmp_path / "man",
                                   per_family=2) == 5
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"short": "add and remove users and groups", "long": (
        "This package includes the 'adduser' and 'deluser' commands. Adding users with "
        "'adduser' is much easier.")}
    assert [r["short"] for r in rows[1:]] == ["GNU Bourne Again SHell",
                                              "list directory contents", "sub-command 0",
                                              "sub-command 1"]
    assert write_description_pairs(out, limit=2, status=status, man_root=tmp_path) == 2
    with pytest.raises(CrlValueError, match="found 0 description pairs"):
        write_description_pairs(out, status=tmp_path / "none", man_root=tmp_path / "none")
