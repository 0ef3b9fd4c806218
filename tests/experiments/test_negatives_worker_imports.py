"""A study's worker unpickles its task and trains: it never loads the study's analysis (curves,
laws, the verify stage's planning, scipy's optimisers), which only the driver runs."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from crl.experiments.executors.grouping import plan_tasks
from crl.experiments.negatives import NegativesStudy

CHILD = """
import json, pickle, sys
task = pickle.load(open(sys.argv[1], "rb"))
heavy = ["scipy.optimize", "scipy.stats", "crl.experiments.negatives.curves",
         "crl.experiments.negatives.laws", "crl.experiments.negatives.analysis"]
print(json.dumps({"task": type(task).__name__, "runs": len(task.specs),
                  "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_a_worker_unpickling_a_group_task_loads_no_analysis(tmp_path: Path) -> None:
    study = NegativesStudy("quick")
    tasks = plan_tasks(study, study.runs(), tmp_path / "study")
    path = tmp_path / "task.pkl"
    path.write_bytes(pickle.dumps(tasks[0]))
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["task"] == "GroupTask" and got["runs"] > 1
    assert got["loaded"] == []
