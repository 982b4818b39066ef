# Two commands do all set-up on a fresh machine:
#   make demo   venv + install + a sweep on the embedded simulator, ending with a promoted champion
#   make test   venv + install (+ Chromium for the UI test) + mypy and ruff + the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install hooks demo test test-fast test-sglang check browser clean

# Two stamps: the demo needs the package alone (the simulator, Ray, Optuna, MLflow); the tests also need
# the test extra, whose torch (SGLang 0.5.23's pin, 2.14.1, a CUDA build with NCCL: several GB) the probe's
# tests import, so a newcomer's `make demo` does not wait for it.
install: $(VENV)/.installed
	@hooks=$$(git rev-parse --git-path hooks 2>/dev/null) && ! cmp -s scripts/commit-msg "$$hooks/commit-msg" \
	  && echo "hint: 'make hooks' installs the commit-msg hook (subject <= 72 characters, blank line before the body)" || true

# The commit-msg hook (scripts/commit-msg) into this clone's hooks folder. An existing different hook is never
# overwritten: the target says so and stops; compare the two, remove or merge yours, and run it again.
hooks:
	@hooks=$$(git rev-parse --git-path hooks) || { echo "make hooks: not a git checkout"; exit 1; }; \
	target="$$hooks/commit-msg"; \
	if [ -e "$$target" ] && ! cmp -s scripts/commit-msg "$$target"; then \
	  echo "make hooks: $$target exists and differs from scripts/commit-msg: left as it is."; \
	  echo "  compare them (diff $$target scripts/commit-msg), remove or merge yours, then run make hooks again"; \
	  exit 1; \
	fi; \
	mkdir -p "$$hooks" && cp scripts/commit-msg "$$target" && chmod +x "$$target" && echo "commit-msg hook: $$target"

$(VENV)/.installed-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-base
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The demo owns runs/demo: each `make demo` starts a fresh sweep there.
demo: $(VENV)/.installed-base
	rm -rf runs/demo
	$(BIN)/sweep run experiments/demo.yaml --workdir runs/demo
	$(BIN)/sweep export --workdir runs/demo --format env -o runs/demo/exported-champion.env

# Chromium from Debian's packages drives the MLflow UI test (never a downloaded browser).
browser:
	@command -v chromium >/dev/null 2>&1 || ( \
	  echo "installing Debian's chromium for the UI test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || { echo "could not install chromium: run 'apt-get install -y chromium' as root"; exit 1; } )

# Types, lint and format first: mypy (pinned in the test extra, configured in pyproject) must report zero
# errors, and `ruff format --check` fails on any file `ruff format` would change.
check: install
	$(BIN)/mypy
	$(BIN)/ruff check orchestrator tests bench scripts
	$(BIN)/ruff format --check orchestrator tests bench scripts
	$(BIN)/python scripts/check_complexity.py --max 15 orchestrator

# Two pytest-xdist workers, a test file each at a time (--dist loadfile keeps a file's module fixtures in one
# process): most tests wait on servers and processes they start, so two workers halve the wall time on a
# 2-core machine (docs/testing.md has the figures). PYTEST_WORKERS=0 runs everything in one process.
# --no-loadscope-reorder: files in collection order, where tests/conftest.py puts the longest first.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: install browser check
	$(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) -m "not sglang_real"

test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"

# The real-SGLang tier (docs/testing-sglang.md): SGLang 0.5.23 on this machine's CPU, in a venv of its own
# built once and reused (.venv-sglang/, out of git); the tests make their tiny model at run time.
SGLANG_VENV := .venv-sglang
SGLANG_REQS := tests/sglang_real/requirements.txt

$(SGLANG_VENV)/.installed: $(SGLANG_REQS)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r $(SGLANG_REQS)
	$(SGLANG_VENV)/bin/pip install -q --no-deps sglang==0.5.23
	echo "$(CURDIR)/tests/sglang_real/standin" > $$(ls -d $(SGLANG_VENV)/lib/python3*/site-packages)/sglang_test_standin.pth
	touch $@

test-sglang: install $(SGLANG_VENV)/.installed
	SWEEP_SGLANG_PYTHON=$(CURDIR)/$(SGLANG_VENV)/bin/python $(BIN)/python -m pytest -q -p no:cacheprovider \
	  -m sglang_real tests/sglang_real/test_sweep.py tests/sglang_real/test_trial.py tests/sglang_real/test_sglang_interrupt.py tests/sglang_real/test_outputs_real.py \
	  tests/sglang_real/test_adaptive_export_real.py

clean:
	rm -rf $(VENV) runs build *.egg-info
