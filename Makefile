# fanout-lab: the two commands a user needs are `make report` (the study) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-unit test-integration up down status report lab clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)  ## idempotent: venv, package, system packages, stack artifacts
	$(BIN)/lab stack provision

test: setup  ## unit tests, then integration tests against the real native stack
	$(BIN)/pytest tests

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

test-integration: setup
	$(BIN)/pytest tests/integration

up: setup
	$(BIN)/lab stack up

down:
	$(BIN)/lab stack down

status:
	$(BIN)/lab stack status

report: setup
	$(BIN)/lab report

clean: down
	rm -rf .stack
