# The README's two commands are `make demo` and `make test`; everything else is set up by them.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: setup setup-full system-deps demo test sdk-test check lint typecheck importcheck bench-accept bench-retention fuzz clean

$(VENV)/.base: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,mcp]'
	touch $@

$(VENV)/.full: $(VENV)/.base
	$(PIP) install -q -e '.[dev,spark,mcp]'
	touch $@

setup: $(VENV)/.base

setup-full: $(VENV)/.full system-deps

system-deps:
	bash scripts/system-deps

demo: setup
	$(VENV)/bin/tidemesh demo

# pytest (the Python SDK and its conformance run included), then the TypeScript and Go SDKs'
# suites: each is its own toolchain's test runner, so scripts/sdk-tests runs them as they are
# run by hand (docs/testing.md, "The SDKs").
# pytest on two xdist workers (--dist worksteal): a test here mostly waits for the processes
# it starts, and one pytest process left the two cores half idle. TEST_WORKERS=0 runs it in
# one process (about three times as long; docs/testing.md).
TEST_WORKERS ?= 2
test: setup-full
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal
	bash scripts/sdk-tests

sdk-test: setup
	bash scripts/sdk-tests

lint: setup
	$(VENV)/bin/ruff check .

# mypy cannot follow package-dir; the script checks tidemesh/ as it installs (see its docstring).
typecheck: $(VENV)/.full
	$(PY) scripts/typecheck.py

# The import boundaries of pyproject.toml [tool.importlinter], on tidemesh as it installs.
importcheck: setup
	$(PY) scripts/importcheck.py

check: lint typecheck importcheck

# The long fuzz run (>100,000 cases; not part of `make test`): schemathesis against a real
# daemon, then the WebSocket frame and IPC edge fuzzers (deep nesting, numeric edges).
# FUZZ_ARGS='--max-examples 50 --ws-examples 500 --edge-examples 200'
# shortens it.
fuzz: setup
	$(PY) scripts/fuzz.py $(FUZZ_ARGS)

bench-accept: setup
	$(PY) bench/accept.py

bench-retention: setup
	$(PY) bench/retention.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
