# fedtune — `make run` (the main job on embedded defaults) and `make test`.
# Both create .venv from nothing: torch first (pinned CPU build), then the project with all extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fedtune-installed
PYTEST_ARGS ?=

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fedtune tune examples/quickstart.yaml

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
