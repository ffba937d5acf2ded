# ddtree-ops: `make demo` runs the story on the built-in lab; `make test` runs every test.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements-sglang-cpu.txt scripts/install.sh | sha256sum | cut -c1-12)
# four pytest-xdist workers: the lab tests (mostly waiting on real systemd) in three, each test holding the
# lab hosts it touches, and every other test file beside them; tests/conftest.py makes the groups (the lab's
# by the hosts their tests hold: tests/labkit.py's lab_group)
WORKERS ?= 4
XDIST := -n $(WORKERS) --dist loadgroup --no-loadscope-reorder

.PHONY: install packages test test-fast test-lab demo bench golden lab-down clean help

help:
	@echo "make demo       bring up the lab (ct129, ct200) and tell the story with the tool itself"
	@echo "make test       every test: unit, SSH, engine, lab (real systemd + sshd hosts)"
	@echo "make test-fast  the tests that need no lab hosts and are not slow (under 3 minutes)"
	@echo "make packages   the lab's Debian packages (root installs them; otherwise the command is printed)"
	@echo "make bench      benchmarks (figures go to BENCHMARKS.md by hand)"
	@echo "make golden     refresh the golden unit files after an intended rendering change"

# one line per stage; pip's output only when a stage fails (scripts/install.sh says what it filters)
$(STAMP):
	@scripts/install.sh "$(PY)" "$(VENV)"
	@touch $@

install: $(STAMP)

# the lab's Debian packages (mmdebstrap, systemd-container, OpenSSH, iproute2, systemd-analyze):
# installed when missing if root, else one line naming the apt-get command; silent when all is there.
# The standard library is enough, so it runs before the virtualenv exists.
packages:
	@$(PY) -m ddtree_ops.lab._sys packages

# The project's own modules are byte-compiled before the run: every lab test starts `ddtree-ops` in a process
# of its own, and where PYTHONDONTWRITEBYTECODE is set each of them compiled the tool afresh.
# The lab's tree (Debian and its SGLang venv, about a minute from an empty cache) is built while `make install`
# runs, by the standard library alone; its lines are shown once both are done. A failed build is shown and left
# to the lab tests, which build it again and fail with its error.
test: packages
	@log=$$(mktemp); $(PY) -m ddtree_ops.lab.tree >"$$log" 2>&1 & tree=$$!; \
	$(MAKE) --no-print-directory -s install; rc=$$?; \
	wait $$tree || echo "make test: building the lab tree beforehand failed; the lab tests build it again:"; \
	cat "$$log"; rm -f "$$log"; exit $$rc
	@$(BIN)/python -m compileall -q ddtree_ops tests >/dev/null || true
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not lab and not slow"

test-lab: install packages
	$(BIN)/python -m pytest -m lab

demo: install packages
	PATH="$(abspath $(BIN)):$$PATH" scripts/demo.sh

bench: install
	$(BIN)/python bench/startup.py

golden: install
	$(BIN)/python -m pytest tests/unit/test_render.py --update-golden -q

lab-down:
	$(BIN)/ddtree-ops lab down

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
