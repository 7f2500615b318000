# make install: set up .venv (an MPI, torch, paraflow, Horovod; no root needed: docs/hpc.md); make test; make bench; make docs.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.paraflow-installed

.PHONY: install lint test test-long test-cluster soak bench docs clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py scripts/install.sh scripts/build_horovod.sh paraflow/backends/horovod/build.py \
		paraflow/environment/mpi_library.py paraflow/backends/horovod/gpu_build.py \
		paraflow/backends/horovod/build_failure.py scripts/install_torch.py
	bash scripts/install.sh $(VENV)
	touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

# Two test processes, one per core; a module whose tests share launches stays in one (xdist_group).
test: lint
	$(PY) -m pytest -n 2 --dist loadgroup

test-long: install
	$(PY) -m pytest -m "long and not soak and not cluster"

test-cluster: install
	$(PY) -m pytest -m cluster tests/tools/cluster

soak: install
	$(PY) -m pytest -m soak tests/reliability

bench: install
	$(VENV)/bin/paraflow bench

# The docs site (MkDocs) into site/; --strict fails on broken links and pages missing from the nav.
DOCS_STAMP := $(VENV)/.paraflow-docs-installed

$(DOCS_STAMP): $(STAMP) setup.cfg
	$(PY) -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache bench-results site
