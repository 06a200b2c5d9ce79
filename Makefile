# Everything installs into .venv on first use; `make test` and `make demo` need nothing else.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.deps-installed
HVD    := $(VENV)/.horovod-installed
HOROVOD_VERSION := 0.28.1
HOROVOD_ENV := HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
               HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2
PYTEST_ARGS ?=

.PHONY: setup test demo bench bench-kvstore bench-train clean help

help:
	@echo "make demo    - set up (first time) and run the 2-worker comparison on the shipped MNIST"
	@echo "make test    - set up (first time) and run the test suite"
	@echo "make bench   - kvstore round rates and end-to-end training speed vs MXNet's own stores"
	@echo "make setup   - only create .venv with pinned dependencies and horovod"

$(STAMP): requirements.txt setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] >= (3, 10), "Python >= 3.10 needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --disable-pip-version-check -q -r requirements.txt
	$(PIP) install --disable-pip-version-check -q --no-deps gluoncv==0.10.5.post0
	$(PIP) install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	touch $@

# Horovod is built from source against the installed mxnet (Gloo, no MPI); about 3 minutes.
$(HVD): $(STAMP)
	$(HOROVOD_ENV) $(PIP) install --disable-pip-version-check -q --no-build-isolation \
	    --no-cache-dir horovod==$(HOROVOD_VERSION)
	$(PY) -c "import horovod.mxnet"
	touch $@

setup: $(STAMP) $(HVD)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: setup
	$(PY) scripts/demo.py

bench: bench-kvstore bench-train

bench-kvstore: setup
	$(PY) scripts/bench_kvstore.py --trials 3 --out results/bench

bench-train: setup
	$(PY) scripts/bench_train.py --trials 3 --out results/bench

clean:
	rm -rf $(VENV) results .pytest_cache
