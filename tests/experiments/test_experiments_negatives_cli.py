"""``crl study negatives`` on the user's setup, at smoke size through the CLI: ``--config`` with
every grid override, a text ``.jsonl`` with and without a config, checks before any worker, and
the message when every run fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.experiments.api import run_and_report
from crl.experiments.negatives import NegativesStudy

runner = CliRunner()
SMALL = ["--fractions", "0.25,1", "--budget", "128", "--batch-size", "32", "--refine-runs", "0",
         "--workers", "1", "--no-progress"]


def _specs(study_dir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(study_dir.glob("*/spec.json"))]


def test_config_and_every_override_through_the_cli(tmp_path: Path) -> None:
    args = ["study", "negatives", "--preset", "smoke", "--config", "synthetic-gaussian",
            "--loss", "gcl", "--ns", "64,128",
            "--fractions", "0.25,1", "--seeds", "0,1", "--budget", "256", "--batch-size", "32",
            "--device", "cpu", "--target-n", "500", "--refine-runs", "0", "--out",
            str(tmp_path), "--workers", "1", "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    study_dir = tmp_path / "negatives"
    specs = _specs(study_dir)
    assert len(specs) == 2 * (3 + 3)  # per seed and n: 25% in two regimes, 100% shared once
    for spec in specs:
        config, tags = spec["config"], spec["tags"]
        assert isinstance(config, dict) and isinstance(tags, dict)
        # the config's model, optimiser and loss options stay; the study sets the rest
        assert config["model"]["kind"] == "linear" and config["model"]["embed_dim"] == 2
        assert config["optim"]["lr"] == 0.01 and config["loss"]["temperature"] == 1.0
        assert config["loss"]["name"] == "gcl"  # --loss gcl (the preset's InfoNCE would stay)
        assert config["train"]["batch_size"] == 32 and config["train"]["max_samples"] == 256
        assert config["train"]["steps"] is None and config["train"]["device"] == "cpu"
        assert config["data"]["num_train"] == tags["n"] in (64, 128)
        assert config["negatives"]["m"] == max(1, round(tags["m_fraction"] * tags["n"]))
        assert tags["seed"] in (0, 1)
    analysis = json.loads((study_dir / "analysis.json").read_text())
    assert {r["target_n"] for r in analysis["numbers"]["recommendations"].values()} == {500}
    page = (study_dir / "report.html").read_text()
    assert "--preset smoke" in page and "--config synthetic-gaussian" in page
    assert "--ns 64,128" in page
    assert "Distinct runs finished: 12 of 12" in page
    assert "<title>crl study negatives (custom grid, from the smoke preset)</title>" in page
    assert "The grid is custom: --ns, --fractions, --seeds" in page


def smoke_study(config: Path, out: Path) -> Path:
    """``crl study negatives --preset smoke --config CONFIG`` at n = 32, 64, one seed, two
    fractions; returns the study directory."""
    result = runner.invoke(app, ["study", "negatives", "--preset", "smoke", "--config",
                                 str(config), "--ns", "32,64", "--seeds", "0", "--fractions",
                                 "0.25,1", "--budget", "64", "--batch-size", "16",
                                 "--refine-runs", "0", "--out", str(out), "--workers", "1",
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    return out / "negatives"


def _text_pairs(path: Path, count: int = 300) -> Path:
    words = ["parse", "file", "return", "list", "value", "open", "read", "sort", "join", "split"]
    with open(path, "w") as handle:
        for i in range(count):
            a, b = words[i % 10], words[(i // 10) % 10]
            handle.write(json.dumps({"a": f"{a} the {b} number {i}",
                                     "b": f"def {a}_{b}_{i}(x): return x.{b}({i})"}) + "\n")
    return path


def test_text_jsonl_without_a_config_picks_a_text_model(tmp_path: Path) -> None:
    data = _text_pairs(tmp_path / "pairs.jsonl")
    too_big = runner.invoke(app, ["study", "negatives", "--preset", "smoke", "--data", str(data),
                                  "--ns", "64,512", "--out", str(tmp_path / "a"), *SMALL])
    assert too_big.exit_code == 2 and "exceed" in too_big.output  # n = 512 > the split
    assert not list((tmp_path / "a").glob("negatives/*/spec.json"))  # checked before any run
    result = runner.invoke(app, ["study", "negatives", "--preset", "smoke", "--data", str(data),
                                 "--ns", "64,128", "--seeds", "0", "--out", str(tmp_path / "b"),
                                 *SMALL])
    assert result.exit_code == 0, result.output
    facts = json.loads((tmp_path / "b" / "negatives" / "data.json").read_text())
    assert facts["model_kind"] == "embedding_bag" and facts["data_kind"] == "text"
    assert facts["test_size"] == 60 and facts["train_size"] == 240  # the study holds out no val
    # the answer is for the pairs crl train trains on: 300 less 10% validation and 20% test
    assert facts["user_train_size"] == 210
    numbers = json.loads((tmp_path / "b" / "negatives" / "analysis.json").read_text())["numbers"]
    assert {r["target_n"] for r in numbers["recommendations"].values()} == {210}
    page = (tmp_path / "b" / "negatives" / "report.html").read_text()
    assert "The answer is for n = 210, the 210 training pairs crl train draws" in page


def test_text_jsonl_with_a_config_and_a_model_that_cannot_take_it(tmp_path: Path) -> None:
    data = _text_pairs(tmp_path / "pairs.jsonl")
    config = {"data": {"name": "files", "files": {"path": str(data)}},
              "model": {"kind": "embedding_bag", "embed_dim": 16, "token_dim": 16},
              "loss": {"name": "info_nce", "temperature": 0.1},
              "negatives": {"regime": "shared", "m": 4},
              "optim": {"lr": 0.003}}
    good = tmp_path / "run.yaml"
    good.write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["study", "negatives", "--preset", "smoke", "--config",
                                 str(good), "--ns", "64,128",
                                 "--seeds", "0", "--out", str(tmp_path / "a"), *SMALL])
    assert result.exit_code == 0, result.output
    specs = _specs(tmp_path / "a" / "negatives")
    # InfoNCE with a negative set is a loss that takes sets: the study keeps it
    assert {s["config"]["loss"]["name"] for s in specs} == {"info_nce"}  # type: ignore[index]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**config, "model": {"kind": "mlp"}}))
    result = runner.invoke(app, ["study", "negatives", "--preset", "smoke", "--config",
                                 str(bad), "--ns", "64,128",
                                 "--seeds", "0", "--out", str(tmp_path / "b"), *SMALL])
    assert result.exit_code == 2
    assert "does not take text data" in result.output and "run `" not in result.output
    assert not list((tmp_path / "b").glob("negatives/*/spec.json"))


def test_when_every_run_fails_the_message_says_how_many_and_the_first_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: NegativesStudy, spec: object, run_dir: Path, *, resume: bool) -> None:
        raise RuntimeError("out of patience at step 3")

    monkeypatch.setattr(NegativesStudy, "execute", fail)
    with pytest.raises(CrlValueError) as caught:
        run_and_report("negatives", preset="smoke", out=tmp_path, workers=1, progress=False,
                       data="synthetic", ns=[64, 128], fractions=[0.25, 1.0], seeds=[0],
                       refine_runs=0, group_runs=False)  # execute() is what fails here
    message = str(caught.value)
    assert "all 6 runs failed" in message and "out of patience at step 3" in message
    assert "\n" not in message and "run `" not in message


def test_study_data_takes_every_format_crl_train_reads(tmp_path: Path) -> None:
    """`--data` accepts each file type of `data.name: files` and a save_to_disk directory."""
    from crl.experiments.negatives.grid import data_section

    for suffix in (".npz", ".jsonl", ".csv", ".tsv", ".parquet"):
        path = tmp_path / f"pairs{suffix}"
        path.write_bytes(b"")
        kind, section = data_section(str(path))
        assert kind == "files" and section["files"]["path"] == str(path.resolve())
    assert data_section(str(tmp_path))[0] == "files"
    with pytest.raises(CrlValueError, match="does not exist"):
        data_section(str(tmp_path / "missing.csv"))


def test_a_pretrained_transformer_config_gets_its_zero_shot_baseline(
        tmp_path: Path, tiny_bert: Path) -> None:
    """A ``--config`` that fine-tunes a pretrained encoder: the study measures that encoder
    before fine-tuning on the test split (recomputed here with sentence-transformers' own
    modules and a by-hand recall@1) and the report draws and states it."""
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from crl.data import load_data
    from crl.train import load_config

    data = _text_pairs(tmp_path / "pairs.jsonl", count=200)
    config = {"data": {"name": "files", "files": {"path": str(data)}},
              "model": {"kind": "transformer", "pretrained": str(tiny_bert), "head": "none",
                        "max_seq_length": 16},
              "loss": {"name": "gcl", "temperature": 0.1}, "optim": {"lr": 1e-3}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    study_dir = smoke_study(path, tmp_path / "s")
    facts = json.loads((study_dir / "data.json").read_text())
    assert facts["model_kind"] == "transformer" and "zero-shot" in facts["baseline_label"]
    test = load_data(load_config(str(path)).data, progress=False).test
    texts_a = [test[i][0] for i in range(len(test))]
    texts_b = [test[i][1] for i in range(len(test))]
    encoder = Transformer(str(tiny_bert), max_seq_length=16)
    st = SentenceTransformer(modules=[encoder, Pooling(32, pooling_mode="mean")], device="cpu")
    ea, eb = (st.encode(t, convert_to_numpy=True, normalize_embeddings=True)
              for t in (texts_a, texts_b))
    scores = ea @ eb.T
    recall = [float(np.mean(np.argmax(s, axis=1) == np.arange(len(s)))) for s in (scores,
                                                                                   scores.T)]
    assert facts["baseline"] == pytest.approx(float(np.mean(recall)), abs=1e-9)
    numbers = json.loads((study_dir / "analysis.json").read_text())["numbers"]
    assert numbers["baseline"] == facts["baseline"]
    page = (study_dir / "report.html").read_text()
    assert "the pretrained encoder before fine-tuning (zero-shot)" in page
    assert f"recall@1 = {facts['baseline']:.3f}" in page
