# make install: set up .venv (Open MPI, torch, paraflow, Horovod); make test; make bench.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.paraflow-installed

.PHONY: install lint test test-cluster soak bench clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py scripts/install.sh scripts/build_horovod.sh paraflow/backends/horovod/build.py
	bash scripts/install.sh $(VENV)
	touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

test: lint
	$(PY) -m pytest

test-cluster: install
	$(PY) -m pytest -m cluster tests/tools/cluster

soak: install
	$(PY) -m pytest -m soak tests/reliability

bench: install
	$(VENV)/bin/paraflow bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache bench-results
