# ddtree-ops: `make demo` runs the story on the built-in lab; `make test` runs every test.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements-sglang-cpu.txt | sha256sum | cut -c1-12)

.PHONY: install test test-fast test-lab demo bench golden lab-down clean help

help:
	@echo "make demo       bring up the lab (ct129, ct200) and tell the story with the tool itself"
	@echo "make test       every test: unit, SSH, engine, lab (real systemd + sshd hosts)"
	@echo "make test-fast  the tests that need no lab hosts"
	@echo "make bench      benchmarks (figures go to BENCHMARKS.md by hand)"
	@echo "make golden     refresh the golden unit files after an intended rendering change"

$(STAMP):
	$(PY) -m venv $(VENV)
	# torch first, from the CPU wheel: a plain `torch` requirement would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[engine,test]'
	# sglang pins a CUDA torch: install it without deps, plus what its parser and plugin loader import
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements-sglang-cpu.txt
	$(BIN)/pip install --quiet --disable-pip-version-check orjson pybase64 requests starlette anyio msgspec \
		pyzmq tqdm IPython aiohttp pillow
	touch $@

install: $(STAMP)

test: install
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not lab"

test-lab: install
	$(BIN)/python -m pytest -m lab

demo: install
	PATH="$(abspath $(BIN)):$$PATH" scripts/demo.sh

bench: install
	$(BIN)/python bench/startup.py

golden: install
	$(BIN)/python -m pytest tests/unit/test_render.py --update-golden -q

lab-down:
	$(BIN)/ddtree-ops lab down

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
