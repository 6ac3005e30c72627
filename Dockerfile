# syntax=docker/dockerfile:1
# keyorder: one image runs `keyorder operator` and `keyorder run`; a handler image is FROM it
# (examples/handler/Dockerfile). Targets:
#
#   docker build -t keyorder:0.1.0 .                              # runtime (the default, last stage)
#   docker build --target catchup -t keyorder-catchup:0.1.0 .     # + Java and PySpark for `keyorder catchup`
#
# Supply chain (docs/security.md, "Supply chain"): the base image by digest; every Python package
# from requirements/*.txt (generated from the tested environment by `python -m tools.locks`) checked
# against its sha256 (--require-hashes); PySpark, a source archive, built in an isolated build
# environment that can only install the hash-checked setuptools; the Debian packages pinned to versions.
# tests/packaging/test_dockerfile.py checks this file: base by digest, hashes on every pin,
# multi-stage, numeric non-root user in every final stage, no build tools there, the catchup stage's
# Spark-aware entrypoint under tini.

# python:3.11-slim-bookworm as of 2026-08-25 (its multi-platform index: docker-library/repo-info,
# repos/python/remote/3.11-slim-bookworm.md). `make image` builds FROM a local stand-in instead.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b
# The catchup image's Debian packages, from bookworm's current point release. When Debian replaces a
# version the build fails at apt-get install: set the new one (apt-cache policy PACKAGE in the base).
ARG OPENJDK_VERSION=17.0.19+10-1~deb12u2
ARG TINI_VERSION=0.19.0-1+b3

# --- dependencies: wheels of the pinned dependencies (a layer cache survives source changes) --
FROM ${PYTHON_IMAGE} AS dependencies
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY requirements/ requirements/
# The base's pip checks the pinned pip's and setuptools' hashes; that pip checks all the others.
# /wheels/build: the same hash-checked wheels, the only ones an isolated build environment here may use
# (pip's build isolation does not check hashes itself: pip/_internal/build_env/installer.py,
# require_hashes=False), so builds run with build isolation and --no-index --find-links /wheels/build.
RUN python -m pip install --require-hashes --no-deps --only-binary=:all: -r requirements/build.txt \
    && python -m pip download --require-hashes --no-deps --only-binary=:all: -r requirements/build.txt -d /wheels/build
# Binary wheels only: a dependency that would need a compiler fails the build instead of pulling one in.
RUN python -m pip wheel --require-hashes --no-deps --only-binary=:all: -r requirements/image.txt -w /wheels/runtime

# --- catchup-dependencies: + PySpark and its dependencies (PySpark is an sdist: built here) ----
# Downloaded and hash-checked first (reading PySpark's metadata runs its setup.py with the hash-checked
# setuptools installed above: --no-build-isolation here only), then built with build isolation and no
# index, so the only setuptools its build environment can find is the hash-checked one in /wheels/build.
FROM dependencies AS catchup-dependencies
RUN python -m pip download --require-hashes --no-deps --no-build-isolation -r requirements/catchup.txt -d /downloads \
    && python -m pip wheel --no-deps --no-index --find-links /wheels/build /downloads/* -w /wheels/catchup

# --- venv-builder: a venv of the dependencies alone in /opt/keyorder (cached across source changes) --
FROM dependencies AS venv-builder
RUN python -m venv /opt/keyorder \
    && /opt/keyorder/bin/pip install --no-deps --no-index /wheels/runtime/*.whl

# --- catchup-venv-builder: the same plus PySpark ---------------------------------------------
FROM venv-builder AS catchup-venv-builder
COPY --from=catchup-dependencies /wheels/catchup /wheels/catchup
RUN /opt/keyorder/bin/pip install --no-deps --no-index /wheels/catchup/*.whl

# --- builder: keyorder's wheel, installed alone under /opt/keyorder-app (the final stages copy it over
# the venv, so a source change rebuilds a small layer, not the dependencies'), and checked in the venv
FROM venv-builder AS builder
COPY pyproject.toml README.md LICENSE ./
COPY consumer/ consumer/
COPY operator/ operator/
COPY examples/keyorder_example/ examples/keyorder_example/
RUN python -m pip wheel --no-deps --no-index --find-links /wheels/build . -w /wheels/app \
    && /opt/keyorder/bin/pip install --no-deps --no-index --prefix /opt/keyorder-app /wheels/app/*.whl \
    && /opt/keyorder/bin/pip install --no-deps --no-index /wheels/app/*.whl \
    && /opt/keyorder/bin/pip check \
    && /opt/keyorder/bin/keyorder --version

# --- catchup-builder: the same check with PySpark ---------------------------------------------
FROM catchup-venv-builder AS catchup-builder
COPY --from=builder /opt/keyorder-app /opt/keyorder-app
RUN cp -a /opt/keyorder-app/. /opt/keyorder/ \
    && /opt/keyorder/bin/pip check \
    && /opt/keyorder/bin/keyorder --version

# --- base: what both final images share ------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
# A named user with a fixed numeric UID: Kubernetes' runAsNonRoot needs a numeric USER, and
# Python's getpass (used by kopf outside a pod) needs a passwd entry.
RUN groupadd --gid 65532 keyorder \
    && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin keyorder
ENV PATH=/opt/keyorder/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title="keyorder" \
      org.opencontainers.image.description="Key-ordered Kafka consumers on Kubernetes: keyorder run | operator" \
      org.opencontainers.image.licenses="Apache-2.0"

# --- catchup: + a Java runtime and PySpark for `keyorder catchup` ---------------------------
FROM base AS catchup
ARG OPENJDK_VERSION
ARG TINI_VERSION
# (slim images drop /usr/share/man, where the JRE's post-install step links its man pages)
# tini: an init as PID 1 (below), so SIGTERM reaches the driver and zombies are reaped.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends "openjdk-17-jre-headless=${OPENJDK_VERSION}" "tini=${TINI_VERSION}" \
    && rm -rf /var/lib/apt/lists/*
COPY --from=catchup-venv-builder /opt/keyorder /opt/keyorder
COPY --from=catchup-builder /opt/keyorder-app/ /opt/keyorder/
USER 65532:65532
# Spark on Kubernetes starts executor pods with `executor` and cluster-mode driver pods with
# `driver ...`: this entrypoint runs Spark's executor backend or spark-submit for those, and
# `keyorder ...` for everything else (so `catchup ...` works as with the runtime image).
# Under tini, not as PID 1 itself: the kernel drops any signal to PID 1 that has no handler, so outside
# `keyorder catchup`'s own SIGTERM handler (before it is installed, after the run) Kubernetes' SIGTERM
# would be ignored until the SIGKILL, and PID 1 must reap the orphans Spark's Python workers leave.
# tini passes the signal to its child only (no -g): the driver's JVM must keep running while
# `keyorder catchup` cancels the wave, writes its report and stops Spark (deleting the executors).
ENTRYPOINT ["tini", "--", "keyorder-spark-entrypoint"]
CMD ["--help"]

# --- runtime (default): keyorder operator | keyorder run -------------------------------------
FROM base AS runtime
COPY --from=venv-builder /opt/keyorder /opt/keyorder
COPY --from=builder /opt/keyorder-app/ /opt/keyorder/
USER 65532:65532
ENTRYPOINT ["keyorder"]
CMD ["--help"]
