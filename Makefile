# Two commands on a fresh machine:  `make run` (set up + run the main job), `make test` (the tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL := models/default/manifest.json

.PHONY: setup run test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in the extras: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

$(MODEL): $(BIN)/.installed $(wildcard infra/pack/*.py)
	$(BIN)/warmstart pack --default --force

setup: $(MODEL)

run: setup
	$(BIN)/warmstart demo

test: setup
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python bench/bench_coldstart.py

clean:
	rm -rf $(VENV) models build dist
