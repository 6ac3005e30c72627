# Every target bootstraps .venv itself, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint docs crds locks bench clean

$(STAMP): pyproject.toml requirements/image.txt requirements/catchup.txt
	@# `keyorder catchup` (PySpark) needs a Java 17+ runtime; install Debian's when there is none.
	command -v java >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/image.txt -c requirements/catchup.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/keyorder dev

test: $(STAMP)
	$(PY) -m ruff check consumer operator tests examples
	$(PY) -m pytest

bench: $(STAMP)
	$(VENV)/bin/keyorder bench

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check consumer operator tests examples
	$(PY) -m ruff format --check consumer operator tests examples

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis

docs: $(STAMP)
	$(PY) -m tools.docs_tables
	$(PY) -m tools.values_table

# The CRD from the spec models, in crds/ and (the same file) in the chart.
crds: $(STAMP)
	$(VENV)/bin/keyorder crd --output crds/orderedconsumers.keyorder.dev.yaml
	cp crds/orderedconsumers.keyorder.dev.yaml charts/keyorder-operator/crds/

# The image's pinned dependency lists, from the installed (tested) versions.
locks: $(STAMP)
	$(PY) -m tools.locks
