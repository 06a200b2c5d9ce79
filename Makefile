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

.PHONY: setup test test-fast demo bench bench-kvstore bench-train bench-dssp-policy bench-dcs3gd bench-plan \
        bench-virtual reproduce reproduce-dssp reproduce-psp reproduce-8workers reproduce-virtual clean help

help:
	@echo "make demo    - set up (first time) and compare BSP, ASP, SSP and DSSP on an emulated GTX 1080 Ti + GTX 1060"
	@echo "make test    - set up (first time) and run the test suite"
	@echo "make test-fast - only the unit tests (no jobs; about a minute)"
	@echo "make bench   - kvstore round rates and end-to-end training speed vs MXNet's own stores,"
	@echo "               the planner's predictions against real jobs (make bench-plan) and"
	@echo "               1,024 virtual workers trained in one process (make bench-virtual)"
	@echo "make reproduce - the DSSP and PSP-SGD papers' experiments at this machine's scale, on emulated"
	@echo "                 devices (about 2 hours; make reproduce-dssp, reproduce-8workers or"
	@echo "                 reproduce-psp for one of them); make reproduce-virtual: virtual-time"
	@echo "                 training beside real jobs of 2, 4 and 8 workers"
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

# the unit tier only: pure logic, no job started (about a minute)
test-fast: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

demo: setup
	$(PY) scripts/demo.py

bench: bench-kvstore bench-train bench-dssp-policy bench-dcs3gd bench-plan bench-virtual

bench-kvstore: setup
	$(PY) scripts/bench_kvstore.py --trials 3 --out results/bench

bench-train: setup
	$(PY) scripts/bench_train.py --trials 3 --out results/bench

bench-dssp-policy: setup
	$(PY) scripts/bench_dssp_policy.py

# DC-S3GD vs SSGD on Horovod: real CPU compute, then a simulated accelerator (see the script)
bench-dcs3gd: setup
	$(PY) scripts/bench_dcs3gd.py --trials 3 --out results/bench
	$(PY) scripts/bench_dcs3gd.py --trials 3 --device-s 0.1 --batch-size 16 --out results/bench/device

# the planner against a grid of real jobs: calibrate (twice: repeatability), then validate
# (about 35 minutes; results/plan)
bench-plan: setup
	$(PY) -m kvstore_ext.plan calibrate --out results/plan/calibration.json
	$(PY) -m kvstore_ext.plan calibrate --out results/plan/calibration_repeat.json
	$(PY) -m kvstore_ext.plan validate --trials 3 --out results/plan

# 1,024 virtual workers of LeNet on MNIST, every paradigm, in one process (results/virtual_mnist_1024)
bench-virtual: setup
	$(PY) -m kvstore_ext.simulate --train configs/virtual/mnist_1024.yaml --out results/virtual_mnist_1024

reproduce: reproduce-dssp reproduce-8workers reproduce-psp

# virtual time against real jobs on the same emulated devices, n = 2, 4, 8 (about 90 minutes)
reproduce-virtual: setup
	for n in 2 4 8; do $(PY) scripts/reproduce.py configs/virtual/agreement_n$$n.yaml || exit 1; done

reproduce-dssp: setup
	$(PY) scripts/reproduce.py configs/dssp_mnist.yaml

reproduce-psp: setup
	$(PY) scripts/reproduce.py configs/psp_mnist.yaml

reproduce-8workers: setup
	$(PY) scripts/reproduce.py configs/ssp_8workers_transient.yaml

clean:
	rm -rf $(VENV) results .pytest_cache
