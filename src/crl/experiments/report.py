"""The study report: ``results.csv`` -> analysis -> ``report.html`` (self-contained).

Everything here reads files only, so ``crl report STUDY_DIR`` rebuilds the report of a study
(finished or not) without running anything.
"""

from __future__ import annotations

import base64
import html
import math
import shlex
from pathlib import Path
from typing import Any

from crl.env import environment_info
from crl.errors import CrlValueError
from crl.experiments.results import (
    RESULTS_FILE,
    Unreadable,
    collect_results,
    read_results,
    write_results,
)
from crl.experiments.study import Analysis, RunSpec, Study
from crl.rundir import atomic_write, read_json, write_json

REPORT_FILE = "report.html"
ANALYSIS_FILE = "analysis.json"
PLOTS_DIR = "plots"

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 980px;
       margin: 2em auto; padding: 0 1em; color: #1b1b1b; line-height: 1.5; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; }
.headline { background: #f6f8fa; border-left: 4px solid #2f6fb0; padding: 0.8em 1em; }
code, pre { background: #f3f3f3; padding: 0.1em 0.3em; }
"""


def format_number(value: Any) -> str:
    """Numbers for tables: 4 significant digits, NaN as an em dash."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:.4g}"
    return str(value)


def _seconds(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def compute_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the study's runs cost: per distinct run, its ``time/cpu_s`` and
    ``time/train_eval_s`` (docs/training.md, "The run directory"; a grouped run's are its share
    of the group's), summed over the runs that record them (older crl wrote no ``time/cpu_s``).

    Example:
        >>> rows = [{"run_id": "a", "time/cpu_s": 2.0, "time/train_eval_s": 3.0},
        ...         {"run_id": "a", "time/cpu_s": 2.0, "time/train_eval_s": 3.0},
        ...         {"run_id": "b", "time/cpu_s": 6.0, "time/train_eval_s": 5.0},
        ...         {"run_id": "c", "time/train_eval_s": 9.0}]
        >>> compute_totals(rows)["runs_per_cpu_s"], compute_totals(rows)["timed_runs"]
        (0.25, 2)
    """
    runs = {str(r["run_id"]): r for r in rows}
    timed = [(cpu, _seconds(r, "time/train_eval_s")) for r in runs.values()
             if (cpu := _seconds(r, "time/cpu_s")) is not None]
    cpu_s = sum(cpu for cpu, _ in timed)
    return {"runs": len(runs), "timed_runs": len(timed), "cpu_s": cpu_s,
            "train_eval_s": sum(wall or 0.0 for _, wall in timed),
            "runs_per_cpu_s": len(timed) / cpu_s if cpu_s > 0 else None}


def compute_text(totals: dict[str, Any]) -> str:
    """One sentence on :func:`compute_totals`: runs per CPU-second.

    Example:
        >>> compute_text({"runs": 3, "timed_runs": 2, "cpu_s": 8.0, "train_eval_s": 8.0,
        ...               "runs_per_cpu_s": 0.25})  # doctest: +NORMALIZE_WHITESPACE
        "Compute: 2 runs in 8 CPU-seconds of training and evaluation (the sum of the runs'
        time/cpu_s; a grouped run counts its share of its group's), 0.25 runs per CPU-second;
        process start-up and building the data and models are not counted. 1 other run
        records no CPU time (an older crl's, or not a crl train run)."
    """
    timed, untimed = totals["timed_runs"], totals["runs"] - totals["timed_runs"]
    if not timed or totals["runs_per_cpu_s"] is None:
        return "Compute: not recorded (no run's summary.json holds time/cpu_s)."
    text = (f"Compute: {timed:,} run{'s' * (timed != 1)} in {totals['cpu_s']:,.4g} CPU-seconds "
            "of training and evaluation (the sum of the runs' time/cpu_s; a grouped run counts "
            f"its share of its group's), {totals['runs_per_cpu_s']:.4g} runs per CPU-second; "
            "process start-up and building the data and models are not counted.")
    if untimed:
        text += (f" {untimed:,} other run{'s' * (untimed != 1)} record{'s' * (untimed == 1)} "
                 "no CPU time (an older crl's, or not a crl train run).")
    return text


def _image_tag(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def unreadable_text(unreadable: list[Unreadable]) -> str:
    """One sentence on the finished runs whose results cannot be read ("" when none).

    Example:
        >>> print(unreadable_text([Unreadable("n64-s0-1a", "retrieval/x2y_recall@1", "'abc'")]))
        ... # doctest: +NORMALIZE_WHITESPACE
        1 finished run cannot be read and is left out of the analysis: n64-s0-1a:
        retrieval/x2y_recall@1 = 'abc'. Delete such a run's summary.json and re-run the study
        to train it again.
    """
    runs = len({u.run_id for u in unreadable})
    if not runs:
        return ""
    return (f"{runs} finished run{'s' * (runs != 1)} cannot be read and "
            f"{'are' if runs != 1 else 'is'} left out of the analysis: "
            + "; ".join(str(u) for u in unreadable)
            + ". Delete such a run's summary.json and re-run the study to train it again.")


def _unreadable_html(unreadable: list[Unreadable]) -> list[str]:
    if not unreadable:
        return []
    parts = [f"<p class='headline'>{html.escape(unreadable_text(unreadable))}</p>",
             "<table><tr><th>run</th><th>key</th><th>value</th></tr>"]
    parts.extend(f"<tr><td>{html.escape(u.run_id)}</td><td>{html.escape(u.key)}</td>"
                 f"<td>{html.escape(u.value)}</td></tr>" for u in unreadable)
    parts.append("</table>")
    return parts


def render_html(study_dir: Path, title: str, analysis: Analysis, command: str,
                environment: dict[str, Any], counts: dict[str, int], compute: str = "", *,
                from_results: bool = False) -> str:
    """The report page; images are inlined so the file stands alone. ``counts``: distinct
    runs ``finished`` (their results read) of ``total``; ``compute``: what they cost
    (:func:`compute_text`); ``from_results``: the rows came from ``results.csv``."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='headline'>{html.escape(analysis.headline)}</p>",
        f"<p>Distinct runs finished: {counts['finished']} of {counts['total']}.</p>",
        *([f"<p>{html.escape(compute)}</p>"] if compute else []),
        *_unreadable_html(analysis.unreadable),
    ]
    for section in analysis.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts.extend(f"<p>{html.escape(p)}</p>" for p in section.paragraphs)
        parts.extend(f"<pre>{html.escape(block)}</pre>" for block in section.code)
        for table in section.tables:
            parts.append(f"<h3>{html.escape(table.title)}</h3><table><tr>")
            parts.extend(f"<th>{html.escape(c)}</th>" for c in table.columns)
            parts.append("</tr>")
            for row in table.rows:
                cells = "".join(f"<td>{html.escape(format_number(v))}</td>" for v in row)
                parts.append(f"<tr>{cells}</tr>")
            parts.append("</table>")
        for figure in section.figures:
            path = study_dir / figure.path
            if path.exists():
                parts.append(f"<figure>{_image_tag(path)}"
                             f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>")
    parts.append("<h2>Reproduce</h2>")
    parts.append(f"<pre>{html.escape(command)}</pre>")
    source, flag = ("results.csv", " --from-results") if from_results else \
        ("the run directories", "")
    parts.append(f"<p>The numbers above are rebuilt from {source} by "
                 f"<code>crl report {html.escape(str(study_dir))}{flag}</code>.</p>")
    parts.append("<h2>Environment</h2><table>")
    for key, value in environment.items():
        parts.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(str(value))}</td></tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def reproduce_command(study: Study) -> str:
    """The ``crl study`` command line that reproduces ``study``."""
    words = ["crl", "study", study.name, "--preset", study.preset]
    for key, value in sorted(study.options.items()):
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        words += [f"--{key.replace('_', '-')}", str(value)]
    return " ".join(shlex.quote(w) for w in words)


def build_report(study: Study, study_dir: Path, *, from_results: bool = False) -> Analysis:
    """Rebuild ``results.csv``, ``analysis.json``, ``plots/`` and ``report.html`` of a study.

    With ``from_results``, the rows are the study's ``results.csv`` itself, which is kept as
    it is: for a study directory whose run directories are gone (the committed results of
    docs/results/ hold only the study's own files).

    Raises:
        CrlValueError: when no finished run can be read (``from_results``: no
            ``results.csv``, or an empty one).
    """
    study.load_state(study_dir)
    specs = study.runs()
    if from_results:
        table = study_dir / RESULTS_FILE
        if not table.is_file():
            raise CrlValueError(f"study report: --from-results reads {table}, which does not "
                                "exist; rebuild from the run directories (without the flag)")
        rows = read_results(table)
        if not rows:
            raise CrlValueError(f"study report: {table} holds no runs")
        return _write_report(study, study_dir, specs, rows, [], from_results=True)
    results = collect_results(specs, study_dir, study.result_keys())
    rows = results.rows
    if not rows:
        if results.unreadable:
            raise CrlValueError(f"{study_dir}: no finished run can be read; "
                                + unreadable_text(results.unreadable))
        failed = sorted(p.parent.name for p in study_dir.glob("*/error.txt"))
        raise CrlValueError(
            f"{study_dir}: no finished runs to report on (no summary.json in any run directory "
            f"of study {study.name!r}"
            + (f"; {len(failed)} runs failed, see {study_dir / failed[0] / 'error.txt'})"
               if failed else f"); run `{reproduce_command(study)}` first")
        )
    first = ["run_id", *dict.fromkeys(k for s in specs for k in s.tags)]
    write_results(results.written, study_dir / RESULTS_FILE, first)
    return _write_report(study, study_dir, specs, rows, results.unreadable)


def _write_report(study: Study, study_dir: Path, specs: list[RunSpec],
                  rows: list[dict[str, Any]], unreadable: list[Unreadable], *,
                  from_results: bool = False) -> Analysis:
    """``analysis.json``, ``plots/`` and ``report.html`` from the result ``rows``."""
    (study_dir / PLOTS_DIR).mkdir(exist_ok=True)
    analysis = study.analyze(rows, study_dir)
    analysis.unreadable = unreadable
    compute = compute_totals(rows)
    write_json(study_dir / ANALYSIS_FILE, {"headline": analysis.headline,
                                          "numbers": analysis.numbers, "compute": compute,
                                          "unreadable": [u.to_dict() for u in unreadable]})
    recorded = study_dir / "environment.json"
    environment = read_json(recorded) if recorded.exists() else environment_info()
    if not recorded.exists():
        write_json(recorded, environment)
    page = render_html(study_dir, study.title(), analysis,
                       reproduce_command(study), environment,
                       {"finished": len({r["run_id"] for r in rows}),
                        "total": len({s.run_id for s in specs})}, compute_text(compute),
                       from_results=from_results)
    atomic_write(study_dir / REPORT_FILE, lambda f: f.write(page.encode("utf-8")))
    return analysis
