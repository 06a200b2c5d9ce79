# Everything installs into .venv on first use; `make test` and `make demo` need nothing else.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.deps-installed
HVD    := $(VENV)/.horovod-installed
SYSPKG := $(VENV)/.system-packages
# what tests/integration/test_remote_launch.py needs: a real sshd, rsync and Open MPI's mpirun
SYSTEM_PACKAGES := openssh-server openssh-client rsync openmpi-bin
HOROVOD_VERSION := 0.28.1
HOROVOD_ENV := HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
               HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2
PYTEST_ARGS ?=

.PHONY: setup test test-long test-fast demo bench bench-kvstore bench-lanes bench-train bench-targets bench-optimizer bench-dssp-policy bench-dcs3gd bench-plan \
        bench-virtual reproduce reproduce-dssp reproduce-psp reproduce-8workers reproduce-virtual clean help

help:
	@echo "make demo    - set up (first time) and compare BSP, ASP, SSP and DSSP on an emulated GTX 1080 Ti + GTX 1060"
	@echo "make test    - set up (first time) and run the test suite, all but its long experiments"
	@echo "make test-long - only the long experiments (about 12 minutes; CI runs both)"
	@echo "make test-fast - only the unit tests (no jobs; about a minute)"
	@echo "make bench   - kvstore round rates and end-to-end training speed vs MXNet's own stores,"
	@echo "               what shared memory saves a round (make bench-lanes),"
	@echo "               the planner's predictions against real jobs (make bench-plan) and"
	@echo "               1,024 virtual workers trained in one process (make bench-virtual)"
	@echo "make reproduce - the DSSP and PSP-SGD papers' experiments at this machine's scale, on emulated"
	@echo "                 devices (about 2 hours; make reproduce-dssp, reproduce-8workers or"
	@echo "                 reproduce-psp for one of them); make reproduce-virtual: virtual-time"
	@echo "                 training beside real jobs of 2, 4 and 8 workers"
	@echo "make setup   - only create .venv with pinned dependencies and horovod, and (as root, once)"
	@echo "               apt-get install what the ssh/mpi launcher tests need: $(SYSTEM_PACKAGES)"

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

# System packages for the ssh and mpi launcher tests, installed once when missing and possible
# (root with apt-get); otherwise it says why and those tests are skipped, naming what is missing.
$(SYSPKG): | $(STAMP)
	@missing=""; \
	for c in /usr/sbin/sshd:openssh-server /usr/bin/ssh:openssh-client /usr/bin/ssh-keygen:openssh-client \
	         /usr/bin/rsync:rsync /usr/bin/mpirun:openmpi-bin; do \
	    test -x $${c%%:*} || missing="$$missing $${c#*:}"; \
	done; \
	missing=$$(for m in $$missing; do echo " $$m"; done | sort -u | tr -d '\n'); \
	if [ -z "$$missing" ]; then \
	    echo "system packages: $(SYSTEM_PACKAGES) already installed"; \
	elif [ "$$(id -u)" != 0 ]; then \
	    echo "system packages: not root, not installing$$missing (the ssh/mpi launcher tests will be skipped;" \
	         "as root: apt-get install$$missing)"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "system packages: no apt-get, not installing$$missing (the ssh/mpi launcher tests will be skipped)"; \
	else \
	    echo "system packages: installing$$missing"; \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; } \
	        || echo "system packages: apt-get install$$missing failed (the ssh/mpi launcher tests will be skipped;" \
	                "rm $@ to try again)"; \
	fi
	touch $@

setup: $(STAMP) $(HVD) $(SYSPKG)

# everything but the long experiments (marked `long`), well under 20 minutes
test: setup
	$(PY) -m pytest -q -m "not long" $(PYTEST_ARGS)

# the long experiments only: 8 emulated workers against the simulator, dist_asp against
# dist_async at 4 workers over 4 seeds, the demo end to end, ... (about 12 minutes)
test-long: setup
	$(PY) -m pytest -q -m long $(PYTEST_ARGS)

# the unit tier only: pure logic, no job started (about a minute)
test-fast: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

demo: setup
	$(PY) scripts/demo.py

bench: bench-kvstore bench-lanes bench-train bench-targets bench-optimizer bench-dssp-policy bench-dcs3gd bench-plan bench-virtual

bench-kvstore: setup
	$(PY) scripts/bench_kvstore.py --trials 3 --out results/bench

# CPU per LeNet round of a whole job, sockets against shared-memory lanes (about 3 minutes)
bench-lanes: setup
	$(PY) scripts/bench_lanes.py --trials 3 --out results/bench

bench-train: setup
	$(PY) scripts/bench_train.py --trials 3 --out results/bench

# the speed figures against MXNet's own stores, each beside its target (from the two above)
bench-targets: setup
	$(PY) scripts/bench_targets.py --bench results/bench

# the servers' SGD update on MXNet's one-array and multi-tensor kernels, per element
bench-optimizer: setup
	$(PY) scripts/bench_optimizer.py --out results/bench

bench-dssp-policy: setup
	$(PY) scripts/bench_dssp_policy.py

# DC-S3GD vs SSGD on Horovod: real CPU compute, then a simulated accelerator (see the script)
bench-dcs3gd: setup
	$(PY) scripts/bench_dcs3gd.py --trials 3 --out results/bench
	$(PY) scripts/bench_dcs3gd.py --trials 3 --device-s 0.1 --batch-size 16 --out results/bench/device

# the planner against real jobs: calibrate (two calibrations measured unit by unit in turn: repeatability), then validate: a grid of
# parameter-server jobs, then SSGD against DC-S3GD on 2 Horovod workers, on the CPU and on a
# simulated 100 ms device (about an hour and three quarters; results/plan)
bench-plan: setup
	$(PY) -m kvstore_ext.plan calibrate --out results/plan/calibration.json \
	    --repeat-out results/plan/calibration_repeat.json
	$(PY) -m kvstore_ext.plan validate --trials 3 --out results/plan

# 1,024 virtual workers of LeNet on MNIST, every paradigm, in one process (results/virtual_mnist_1024)
bench-virtual: setup
	$(PY) -m kvstore_ext.simulate --train configs/virtual/mnist_1024.yaml --out results/virtual_mnist_1024

reproduce: reproduce-dssp reproduce-8workers reproduce-psp

# virtual time against real jobs on the same emulated devices, n = 2, 4, 8 (about 90 minutes)
reproduce-virtual: setup
	test -f results/plan/calibration.json || $(PY) -m kvstore_ext.plan calibrate --out results/plan/calibration.json
	for n in 2 4 8; do $(PY) scripts/reproduce.py configs/virtual/agreement_n$$n.yaml || exit 1; done

reproduce-dssp: setup
	$(PY) scripts/reproduce.py configs/dssp_mnist.yaml

reproduce-psp: setup
	$(PY) scripts/reproduce.py configs/psp_mnist.yaml

reproduce-8workers: setup
	$(PY) scripts/reproduce.py configs/ssp_8workers_transient.yaml

clean:
	rm -rf $(VENV) results .pytest_cache
