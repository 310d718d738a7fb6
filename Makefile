# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test lint install dev bench fuzz clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[openvino]'
	touch $@

$(VENV)/.dev: $(VENV)/.installed examples/numpy-backend/pyproject.toml
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps -e examples/numpy-backend
	@# graphviz draws `codegraft inspect --svg`; its tests skip, saying so, where it is missing.
	@command -v dot >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq graphviz >/dev/null) || echo "note: graphviz not installed; drawing tests will skip"; }
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev

demo: $(VENV)/.installed
	$(PY) examples/demo.py

# Two worker processes: CI has 2 cores, and one process kept one of them idle most of the time
# (gcc and Python are single-threaded): 21 min -> 12 min on a 2-core VM.  `TEST_WORKERS=0` runs
# in one process.
TEST_WORKERS ?= 2

test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS)

lint: $(VENV)/.dev
	$(PY) -m ruff check .
	$(PY) -m mypy codegraft

bench: $(VENV)/.dev
	$(PY) -m pytest -q -m heavy
	$(PY) bench/partition_scale.py
	$(PY) -m bench.models
	$(PY) -m bench.c_models --write bench/C_RESULTS.md

fuzz: $(VENV)/.dev
	$(PY) -m pytest -q -m fuzz -s tests/test_fuzz.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
