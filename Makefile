# fedtune — `make run` (the main job on embedded defaults) and `make test`.
# Both create .venv from nothing: torch first (pinned CPU build), then the project with all extras.
# `make docs` builds the documentation site; `make dist` the light client's wheel, which
# `fedtune serve` hands out to members' laptops at /client/.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fedtune-installed
PYTEST_ARGS ?=
# pytest-xdist workers (0: one process); tests that share the built image or the cluster in a
# box run on one worker (tests/conftest.py, --dist loadgroup)
TEST_WORKERS ?= 2

.PHONY: run test lint docs docs-gen bench lock image dist clean

$(STAMP): pyproject.toml constraints/image.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints/image.txt -e '.[all,dev,docs]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fedtune tune examples/quickstart.yaml

# compileall: the repository's own modules as bytecode, once. With PYTHONDONTWRITEBYTECODE set
# (as on this project's machines) no process writes __pycache__, so each process that imports
# fedtune compiled the modules it imports again (0.23 CPU-s for the 213 of the service and a
# driver), and the suite starts hundreds of them. Up-to-date files are skipped (0.05 CPU-s);
# pip compiled site-packages already.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q fedtune tests benchmarks
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# The documentation site (build/site), warnings as errors; docs-gen rewrites the generated reference.
docs: $(STAMP)
	$(BIN)/python tools/docs_gen.py --check
	$(BIN)/python tools/docs_includes.py --check
	$(BIN)/mkdocs build --strict --quiet

docs-gen: $(STAMP)
	$(BIN)/python tools/docs_gen.py --write
	$(BIN)/python tools/docs_includes.py --write

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_throughput.py

# The light client's wheel, $(DIST)/fedtune-<version>-py3-none-any.whl (tools/client_wheel.py):
# `fedtune serve` hands it out at /client/ (FEDTUNE_CLIENT_WHEEL_DIR; the image ships its own).
DIST ?= dist
dist: $(STAMP)
	$(BIN)/python tools/client_wheel.py --out $(DIST)

# Rewrite the image's lock from this environment (after changing dependencies in pyproject.toml).
lock: $(STAMP)
	$(BIN)/python constraints/freeze.py --write

# The image, localhost/fedtune:<version>: docker/podman where a daemon answers, else buildah
# (no daemon) from a Debian base made with debootstrap; IMAGE_ARGS, e.g. --variant cuda.
IMAGE_ARGS ?=
image:
	$(PYTHON) deploy/build_image.py $(IMAGE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
