# Two entry points: `make demo` and `make test`. Each creates .venv/ on first use.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0  # before the extras, so pip keeps this build of torch
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rollflow sim serve --config examples/sim/demo.yaml --output-dir outputs/demo

lint: $(STAMP)
	$(BIN)/ruff check rollflow tests benchmarks
	$(BIN)/ruff format --check rollflow tests benchmarks

test: lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) outputs .pytest_cache
