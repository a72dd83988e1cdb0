# ferry — the README's two commands: `make demo` and `make test`. Both create and reuse .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

LOCK   := requirements-dev.lock
# torchtitan's integration test runs in its own venv: torchtitan caps datasets (< 4.8) and so
# fsspec/s3fs, while .venv keeps testing the releases `pip install ferry-data[all]` gets.
TITAN_VENV  := .venv-titan
TITAN_PY    := $(TITAN_VENV)/bin/python
TITAN_LOCK  := requirements-titan.lock
TITAN_STAMP := $(TITAN_VENV)/.installed

.PHONY: demo test test-fast test-unit soak lint bench docs venv clean browser promtool azurite lock lock-tool

# Azurite (Microsoft's Azure Storage emulator, from npm) for the az:// tests, into a git-ignored folder
# of this checkout: tests/conftest.py runs .npm-tools/node_modules/azurite (fake-gcs-server, for gs://,
# comes with the Python test requirements).
AZURITE_VERSION := 3.37.0
NPM_TOOLS := .npm-tools

venv: $(STAMP)

# Everything from the lock (exact versions, checked against their sha256), then ferry itself.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --require-hashes --no-deps -r $(LOCK)
	$(PIP) uninstall -q -y ferry 2>/dev/null || true  # the name before ferry-data: its commands would clash
	rm -rf ferry.egg-info  # its build metadata, which Python finds in the checkout
	$(PIP) install -q --no-deps -e .
	touch $(STAMP)

$(TITAN_STAMP): pyproject.toml $(TITAN_LOCK)
	test -x $(TITAN_PY) || $(PYTHON) -m venv $(TITAN_VENV)
	$(TITAN_PY) -m pip install -q --upgrade pip
	$(TITAN_PY) -m pip install -q --require-hashes --no-deps -r $(TITAN_LOCK)
	$(TITAN_PY) -m pip install -q --no-deps -e .
	touch $(TITAN_STAMP)

# Re-resolve both locks under constraints-dev.txt and pin every file with its sha256, with uv's
# `uv pip compile` (after a change to pyproject.toml's requirements or constraints-dev.txt;
# tests/unit/test_lockfile.py fails until the locks match them). uv reads no pip.conf: it gets pip's
# configured find-links and extra indexes (this machine's torch CPU wheel lies in a find-links folder)
# and, as pip does, takes the best version across all of them. uv keeps the versions a lock pins while
# they still fit: `make lock LOCK_FLAGS=--upgrade` takes the newest of all, `--upgrade-package NAME` of one.
LOCK_FLAGS ?=
# A pip setting as pip takes it: its environment variable, else pip's configuration files.
PIP_CONF   = $(or $($(2)),$(shell $(PIP) config get global.$(1) 2>/dev/null))
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python $(PY) -c constraints-dev.txt $(LOCK_FLAGS) \
	--index-strategy unsafe-best-match --custom-compile-command "make lock" \
	$(addprefix --index-url ,$(call PIP_CONF,index-url,PIP_INDEX_URL)) \
	$(addprefix --extra-index-url ,$(call PIP_CONF,extra-index-url,PIP_EXTRA_INDEX_URL)) \
	$(addprefix --find-links ,$(call PIP_CONF,find-links,PIP_FIND_LINKS))

lock: lock-tool
	$(UV_COMPILE) pyproject.toml --extra all -o $(LOCK)
	$(UV_COMPILE) pyproject.toml requirements-titan.in --extra loader --extra torchtitan -o $(TITAN_LOCK)

# uv at constraints-dev.txt's version, into .venv: only `make lock` needs it.
lock-tool:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-dev.txt uv

# Debian's Chromium for the dashboard's browser tests (installed when missing and we are root).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "warning: could not install chromium; browser tests will be skipped"; \
	  else echo "warning: chromium missing and not root; browser tests will be skipped"; fi; }

# Debian's prometheus (promtool and the server) for the monitoring files' checks (when missing and root).
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
	      || echo "warning: could not install prometheus; its checks in tests/integration/test_monitoring_files.py will be skipped"; \
	  else echo "warning: promtool missing and not root; its checks will be skipped"; fi; }

# Azurite at AZURITE_VERSION into .npm-tools/ (when missing or another version; never a global install).
azurite:
	@grep -qs '"version": "$(AZURITE_VERSION)"' $(NPM_TOOLS)/node_modules/azurite/package.json || { \
	  if command -v npm >/dev/null 2>&1; then \
	    npm install --prefix $(NPM_TOOLS) --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION) >/dev/null \
	      || echo "warning: could not install azurite; the az:// tests will be skipped"; \
	  else echo "warning: npm missing; the az:// tests (Azurite) will be skipped"; fi; }

demo: $(STAMP)
	$(PY) tools/demo.py

# The suite runs on TEST_WORKERS pytest-xdist workers, a test module (or class) to a worker, so that a
# module's fixtures (a Ray cluster, a browser, a built wheel) start once; TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadscope)

test: $(STAMP) $(TITAN_STAMP) browser promtool azurite
	$(PY) -m pytest -q -ra -m "not soak" --durations=25 $(XDIST)
	$(TITAN_PY) -m pytest -q -ra tests/integration/test_integration_torchtitan.py

# The long chaos variants (tens of minutes on 2 cores): faults on a bigger fleet for longer.
soak: $(STAMP) azurite
	$(PY) -m pytest -q -ra -m soak

test-fast: $(STAMP) azurite
	$(PY) -m pytest -q -m "not slow and not soak" $(XDIST)

# The in-process tests only (tests/unit/: no processes, servers, sockets or moto), in well under a minute.
test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check shard_tools client service tests bench tools examples
	$(PY) tools/typecheck.py

bench: $(STAMP)
	$(PY) bench/run.py $(BENCH_ARGS)

# The documentation site into site/ (as a module: .venv/bin/ferry would shadow the package for griffe).
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) $(TITAN_VENV) $(NPM_TOOLS) .venv-bench .pytest_cache .mypy_cache .mypy-tree .ruff_cache demo-data bench/data site
