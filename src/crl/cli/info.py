"""``crl info``: versions, threads and devices, for bug reports and reports."""

from __future__ import annotations

import json

import typer

from crl.cli import app
from crl.cli._common import handle_errors
from crl.env import environment_info


@app.command("info")
@handle_errors
def info(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show crl's version, the package versions it runs on, threads and devices.

    Example: crl info --json
    """
    data = environment_info()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        print(f"{key:>22}: {value}")
