# ferry — the README's two commands: `make demo` and `make test`. Both create and reuse .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench venv clean browser

venv: $(STAMP)

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-dev.txt -e '.[all]'
	touch $(STAMP)

# Debian's Chromium for the dashboard's browser tests (installed when missing and we are root).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "warning: could not install chromium; browser tests will be skipped"; \
	  else echo "warning: chromium missing and not root; browser tests will be skipped"; fi; }

demo: $(STAMP)
	$(PY) -m service.demo

test: $(STAMP) browser
	$(PY) -m pytest -q -ra

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check shard_tools client service tests bench
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-bench .pytest_cache .mypy_cache .ruff_cache demo-data bench/data
