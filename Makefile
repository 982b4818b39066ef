# Two commands do all set-up on a fresh machine:
#   make demo   venv + install + a sweep on the embedded simulator, ending with a promoted champion
#   make test   venv + install (+ Chromium for the UI test) + mypy and ruff + the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo test test-fast check browser clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The demo owns runs/demo: each `make demo` starts a fresh sweep there.
demo: install
	rm -rf runs/demo
	$(BIN)/sweep run experiments/demo.yaml --workdir runs/demo
	$(BIN)/sweep export --workdir runs/demo --format env -o runs/demo/exported-champion.env

# Chromium from Debian's packages drives the MLflow UI test (never a downloaded browser).
browser:
	@command -v chromium >/dev/null 2>&1 || ( \
	  echo "installing Debian's chromium for the UI test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || { echo "could not install chromium: run 'apt-get install -y chromium' as root"; exit 1; } )

# Types and lint first: mypy (pinned in the test extra, configured in pyproject) must report zero errors.
check: install
	$(BIN)/mypy
	$(BIN)/ruff check orchestrator tests bench scripts

test: install browser check
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow"

clean:
	rm -rf $(VENV) runs build *.egg-info
