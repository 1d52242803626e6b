# The README's two commands: `make demo` (install + the main job) and `make test`
# (install + the whole suite). Each creates the virtual environment it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test install lint typing layers unit conformance integration crash bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,mysql,duckdb,s3,parquet]'
	$(BIN)/python -m pip install --quiet --no-deps -e examples/dpone-example-connector
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/dpone demo

test: $(STAMP) lint typing layers
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typing: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest tests/unit

conformance: $(STAMP)
	$(BIN)/pytest tests/conformance

integration: $(STAMP)
	$(BIN)/pytest tests/integration

crash: $(STAMP)
	$(BIN)/pytest tests/crash

bench: $(STAMP)
	$(BIN)/python bench/bench_load.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
