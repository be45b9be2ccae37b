# fanout-lab: the two commands a user needs are `make report` (the study) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
KERNEL := $(VENV)/share/jupyter/kernels/fanout-lab/kernel.json


.PHONY: setup lock system-deps lint check test test-full test-unit test-integration test-notebooks up down status report site explore lab clean

# requirements.lock pins every distribution (pip freeze of the venv the figures were measured
# with); pyproject.toml keeps the supported ranges. Refresh the lock with `make lock`.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .  # a .pth entry (pyproject's package-dir): setuptools warns of nothing
	touch $(STAMP)

lock: $(STAMP)  ## re-pin requirements.lock from the current venv (after changing pyproject.toml)
	$(BIN)/pip install -q -e '.[test,notebooks]'
	$(BIN)/pip freeze --exclude-editable | grep -v '^-e ' > requirements.lock

$(KERNEL): $(STAMP)  # the Jupyter kernel papermill runs the notebooks on: this venv's python
	$(BIN)/python -m ipykernel install --sys-prefix --name fanout-lab --display-name 'fanout-lab (.venv)' >/dev/null

setup: system-deps $(STAMP) $(KERNEL)  ## idempotent: system packages, venv, package, kernel, stack artifacts
	$(BIN)/lab stack provision

system-deps:
	bash scripts/system-deps.sh

# Tiers. `check` is the edit loop (lint, types, unit tests, one real wal run). `test` is what CI
# runs: every pipeline, backend, topology and fault family on the real stack once; a further cell of
# a matrix is marked `matrix` and left to `test-full` (and to the study's `lab faults`).
PYTEST_TIMES := --durations=25 --durations-min=1

check: setup lint  ## lint, types, unit tests and one real wal run: the edit loop (a few minutes)
	$(BIN)/pytest -q tests/unit
	$(BIN)/pytest -q 'tests/integration/test_run_wal.py::test_wal_fan_out[1-auto]'

lint: $(STAMP)  ## ruff (lint, import order) on lab/ and tests/, mypy on lab/
	$(BIN)/ruff check lab tests
	$(BIN)/mypy

test: setup lint  ## lint, unit tests, then one real run of every family on the native stack (and a Docker engine)
	BIN=$(BIN) bash scripts/with-docker.sh $(BIN)/pytest $(PYTEST_TIMES) -m 'not matrix' tests/unit tests/integration tests/notebooks

test-full: setup  ## everything, the whole fault, ha and compose matrices included
	BIN=$(BIN) bash scripts/with-docker.sh $(BIN)/pytest $(PYTEST_TIMES) tests/unit tests/integration tests/notebooks

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

test-integration: setup
	BIN=$(BIN) bash scripts/with-docker.sh $(BIN)/pytest tests/integration

test-notebooks: setup  ## every notebook executed with papermill on the smoke profile
	$(BIN)/pytest tests/notebooks

up: setup
	$(BIN)/lab stack up

down:
	$(BIN)/lab stack down

status:
	$(BIN)/lab stack status

PROFILE ?= quick
WITH ?=
# a series id of its own makes a new sitting; the same one again resumes it (an interrupted report)
SERIES_ID ?=

report: setup  ## the study: runs (or resumes) the series, writes data/reports/<id>/report.html (WITH=faults,control adds those parts)
	$(BIN)/lab stack up
	$(BIN)/lab report --profile $(PROFILE) $(if $(WITH),--with $(WITH)) $(if $(SERIES_ID),--series-id $(SERIES_ID))

# The results without a run: the committed sittings (data/sittings) as a static site, no stack started
# and nothing provisioned (the venv and the kernel only). `lab site --base-url URL` for link previews.
OUT ?=

site: $(STAMP) $(KERNEL)  ## the static site (data/site or OUT=DIR): the answer, every sitting's results, the newest report
	$(BIN)/lab site $(if $(OUT),--out $(OUT))

explore: site  ## every table and figure of the committed sittings, without a stack or a run (under a minute)
	@echo "open the results page above in a browser (from disk), or notebooks/results.ipynb in JupyterLab"

lab: setup  ## JupyterLab on notebooks/, with the stack up and `lab` importable
	$(BIN)/pip install -q -e '.[test,notebooks]'
	$(BIN)/lab stack up
	$(BIN)/jupyter lab --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

clean: down
	rm -rf .stack
