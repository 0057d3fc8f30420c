# The project's whole setup: a virtual environment built from the pinned requirements.
# `make run` runs the workflow on the embedded default and writes the report;
# `make test` runs the test suite (what .ci/run calls).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORES ?= all
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: run test report lint clean-results

$(STAMP): requirements.txt requirements-lock.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt -c requirements-lock.txt
	touch $@

run: $(STAMP)
	snakemake --cores $(CORES)
	snakemake --report results/report.html

report: $(STAMP)
	snakemake --report results/report.html

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	snakemake --lint

clean-results:
	rm -rf results .snakemake
