# The two commands of the README. Both set up .venv from nothing first.
.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

# The main job: how many negatives can this data use? Writes runs/negatives/report.html
run: setup
	.venv/bin/crl study negatives --preset quick --out runs

lint: setup
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/mypy src

# The whole test suite (lint, types, tests and doctests).
test: lint
	.venv/bin/python -m pytest -q -n 2
