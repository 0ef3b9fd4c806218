"""The user's path end to end through the CLI (README, "Your own model"): a text-pair ``.jsonl``,
a transformer config with ``loss: clip``, ``crl study negatives --config`` at smoke size on a
tiny BERT; what it prints after the headline parses as YAML documents, each pasted into the
config is accepted by ``crl train``'s loader with ``loss: clip`` kept, and the in-batch one is
the shared answer's m + 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from crl.cli import app
from crl.train import load_config

runner = CliRunner()


def _descriptions(path: Path, count: int = 200) -> Path:
    """Short against long descriptions of the same function, as a text-pair file."""
    words = ["add", "sort", "read", "write", "split", "join", "count", "open", "close", "print"]
    with open(path, "w") as handle:
        for i in range(count):
            verb, other = words[i % 10], words[(i // 10) % 10]
            handle.write(json.dumps({
                "short": f"{verb} {other} {i}",
                "long": f"{verb} the values then {other} them and return the first {i} of "
                        f"the list"}) + "\n")
    return path


def test_the_printed_fragment_pastes_into_the_users_config(tmp_path: Path,
                                                           tiny_bert: Path) -> None:
    data = _descriptions(tmp_path / "descriptions.jsonl")
    user: dict[str, Any] = {
        "data": {"name": "files", "files": {"path": str(data), "columns": {"a": "short",
                                                                            "b": "long"}}},
        "model": {"kind": "transformer", "pretrained": str(tiny_bert), "max_seq_length": 16,
                  "freeze_layers": 1},
        "loss": {"name": "clip"}, "optim": {"lr": 1e-3},
        "train": {"batch_size": 16, "steps": 4}}
    config = tmp_path / "minilm.yaml"
    config.write_text(yaml.safe_dump(user))
    result = runner.invoke(app, [
        "study", "negatives", "--config", str(config), "--preset", "smoke", "--ns", "32,64",
        "--seeds", "0", "--fractions", "0.25,1", "--budget", "64", "--batch-size", "16",
        "--refine-runs", "0", "--out", str(tmp_path / "runs"), "--workers", "1",
        "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    report = next(i for i, line in enumerate(lines) if line.startswith("report: "))
    closing = "\n".join(lines[1:report])  # after the headline, before the report's path
    docs = list(yaml.safe_load_all(closing))
    numbers = json.loads((tmp_path / "runs" / "negatives" / "analysis.json").read_text()
                         )["numbers"]
    regimes = [d["negatives"]["regime"] for d in docs]
    assert regimes == ["shared", "independent", "in_batch"]  # a flat curve bounds m from above
    assert set(numbers["fragments"]) == {"shared", "independent"}
    for doc in docs:
        assert doc["loss"]["name"] == "clip"  # the user's loss stays, in every answer
        pasted = tmp_path / f"pasted-{doc['negatives']['regime']}.yaml"
        pasted.write_text(yaml.safe_dump({**user, **doc}))
        cfg = load_config(str(pasted))
        assert cfg.loss.name == "clip" and cfg.model.freeze_layers == 1
        if doc["negatives"]["regime"] == "in_batch":
            assert cfg.train.batch_size == numbers["fragments"]["shared"]["m"] + 1
            assert cfg.train.micro_batch_size == (32 if cfg.train.batch_size > 32 else None)
        else:
            assert cfg.negatives.m == numbers["fragments"][cfg.negatives.regime]["m"]
    assert "above the model and its optimiser state" not in closing  # not MiniLM: not measured
    assert "plus one micro-batch through your towers" in closing
    page = (tmp_path / "runs" / "negatives" / "report.html").read_text()
    assert "The answer as a config" in page and "<pre>negatives:" in page
