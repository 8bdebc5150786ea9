# Two entry points: `make run` (dashboard) and `make test` (ruff, then the full suite). Both set up .venv on first use.
# `make test-gpu` runs the GPU suite with the machine's own Python (on the GPU machine torch there is a CUDA build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test test-gpu lint data bench clean-results

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .  # the engine importable everywhere, and the `modelab` command
	touch $@

$(DEV_STAMP): requirements-dev.txt requirements.txt $(STAMP)
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

data: $(STAMP)
	$(BIN)/python -m engine data

run: $(STAMP) data
	$(BIN)/python -m streamlit run app/Home.py --server.address 127.0.0.1 --server.port 8501

lint: $(DEV_STAMP)
	$(BIN)/ruff check .

# The suite in two worker processes (pytest-xdist), a test file to each at a time (module fixtures built once): much
# of it waits on worker subprocesses, compilers and the browser, which leaves a core idle for the second process.
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15

# The tests marked gpu (pytest.ini: they need a CUDA device or pick their device by one), with the machine's own
# Python: `make test-gpu` on the GPU machine. Left out: the offline sm_90 builds (marked sm90_offline), which need no
# GPU and run in `make test` wherever nvcc is. The whole selection takes longer than one 10-minute device call, so it
# runs in slices, one call each or one slice per GPU at once (`benchmarks/gpu_check.sh tests` does either):
# GPU_PATHS=tests/engine/kernels, GPU_PATHS=tests/engine/levels, then
# GPU_PATHS="tests/engine --ignore=tests/engine/kernels --ignore=tests/engine/levels". On four GPUs SLICES=four in
# gpu_check.sh balances four slices (the levels' two slowest files beside the CUDA kernels), each well inside a call.
# The 15 slowest tests are listed at the end (where a shorter suite would come from).
GPU_MARKS ?= gpu and not sm90_offline
GPU_PATHS ?= tests/engine
test-gpu:
	$(PY) -m pytest -q -rfE -p no:cacheprovider --durations=15 $(GPU_PATHS) -m "$(GPU_MARKS)"

bench: $(STAMP)
	$(BIN)/python -m engine bench --workload house_price --mode all --device cpu

clean-results:
	rm -f results.duckdb results.duckdb.wal
