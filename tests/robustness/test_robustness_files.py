"""Files crl writes atomically: readable like ordinary files, never half written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

import crl.rundir as rundir
from crl.experiments.plots import save
from crl.rundir import atomic_write, write_json


def test_atomic_files_get_the_umask_mode_not_0600(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    finally:
        os.umask(old)
    write_json(tmp_path / "b.json", {"x": 1})
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == stat.S_IMODE(
        plain.stat().st_mode)


def test_a_failed_plot_keeps_the_old_image(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plots" / "curve.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save(fig, path)
    old = path.read_bytes()
    assert old.startswith(b"\x89PNG")

    def crash(target: str | Path, write: object) -> None:
        def torn(handle: object) -> None:
            handle.write(b"\x89PNG half")  # type: ignore[attr-defined]
            raise KeyboardInterrupt  # as a kill would, mid-write
        atomic_write(target, torn)

    monkeypatch.setattr(rundir, "atomic_write", crash)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    with pytest.raises(KeyboardInterrupt):
        save(fig, path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in path.parent.iterdir()) == ["curve.png"]
