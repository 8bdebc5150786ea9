# Two entry points: `make run` (dashboard) and `make test` (full suite). Both set up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test data bench clean-results

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $@

$(DEV_STAMP): requirements-dev.txt requirements.txt $(STAMP)
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

data: $(STAMP)
	$(BIN)/python -m engine data

run: $(STAMP) data
	$(BIN)/python -m streamlit run app/Home.py --server.address 127.0.0.1 --server.port 8501

test: $(DEV_STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m engine bench --workload house_price --mode all --device cpu

clean-results:
	rm -f results.duckdb results.duckdb.wal
