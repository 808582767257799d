# inferq: `make up` runs the whole stack locally, `make test` runs the whole suite. Both install into .venv first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install up test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U pip setuptools wheel
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@# The wheel holds only inferq* packages; the server roles (functions, gpu_worker, emulator) and bench are the
	@# repository's: its root goes on the venv's path, so `python -m gpu_worker` and uvicorn's subprocesses find them.
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "inferq-repo.pth").write_text(str(pathlib.Path.cwd()) + "\n")'
	@rm -f $(VENV)/.installed-*
	@touch $@

up: $(STAMP)
	$(BIN)/inferq up $(ARGS)

# aws-sam-cli is installed first, outside any test's timeout: on a fresh clone it takes a minute, on a loaded
# machine ten, which a fixture counted against the first infra test's 300 s (tests/infra/conftest.py reuses it)
test: $(STAMP) sam-tools
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy inferq functions gpu_worker emulator

bench: $(STAMP)
	@# the XADD ceiling needs valkey-benchmark or redis-benchmark (Debian redis-tools); best effort
	@command -v valkey-benchmark >/dev/null || command -v redis-benchmark >/dev/null || \
	  apt-get install -y -q redis-tools >/dev/null 2>&1 || echo "bench: no redis-benchmark; ceiling skipped"
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) .inferq .pytest_cache .mypy_cache .ruff_cache .aws-sam

-include mk/*.mk
