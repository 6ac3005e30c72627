"""The catch-up image's entrypoint: a Spark driver or executor when Spark asks, ``keyorder`` otherwise.

Spark on Kubernetes starts every executor pod with the single argument ``executor`` (its settings
in ``SPARK_*`` variables), and a ``--deploy-mode cluster`` driver pod with ``driver <spark-submit
arguments>``. An image whose entrypoint is plain ``keyorder`` turns these into ``keyorder
executor``, which exits. ``keyorder-spark-entrypoint`` does what Spark's own image entrypoint
(``entrypoint.sh``) does for these two, with the pyspark installed in the image as ``SPARK_HOME``,
and hands every other command to ``keyorder``:

* ``executor`` -> ``java ... KubernetesExecutorBackend --driver-url $SPARK_DRIVER_URL ...``;
* ``driver ARGS`` -> ``spark-submit --deploy-mode client --conf spark.driver.bindAddress=... ARGS``;
* anything else (``catchup ...``, ``run``, ``--version``) -> ``keyorder ARGS``.

``spark_command`` is pure (arguments and environment in, command out), so it is unit-tested; the
executor command is also run for real against a missing driver (tests/unit/test_catchup_entrypoint).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

EXECUTOR_BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
EXECUTOR_ENV = {
    "--driver-url": "SPARK_DRIVER_URL",
    "--executor-id": "SPARK_EXECUTOR_ID",
    "--cores": "SPARK_EXECUTOR_CORES",
    "--app-id": "SPARK_APPLICATION_ID",
    "--hostname": "SPARK_EXECUTOR_POD_IP",
    "--resourceProfileId": "SPARK_RESOURCE_PROFILE_ID",
    "--podName": "SPARK_EXECUTOR_POD_NAME",
}
"""The executor backend's arguments and the variables Spark's executor pod sets for them."""


class EntrypointError(RuntimeError):
    """Spark asked for an executor but left a variable it needs unset; the message names it."""


def spark_home(environ: Mapping[str, str]) -> str:
    """``$SPARK_HOME``, else the installed pyspark package (it carries ``bin/`` and ``jars/``)."""
    if environ.get("SPARK_HOME"):
        return environ["SPARK_HOME"]
    spec = importlib.util.find_spec("pyspark")  # found, not imported: `keyorder run` stays light
    if spec is None or not spec.submodule_search_locations:
        raise EntrypointError("pyspark is not installed and SPARK_HOME is not set: use the image's catchup target")
    return str(Path(next(iter(spec.submodule_search_locations))))


def java_executable(environ: Mapping[str, str]) -> str:
    """The ``java`` Spark starts: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH (Spark's ``spark-class``)."""
    return f"{environ['JAVA_HOME']}/bin/java" if environ.get("JAVA_HOME") else "java"


def _java_options(environ: Mapping[str, str]) -> list[str]:
    """``SPARK_JAVA_OPT_<n>`` in the order of ``n``, as Spark's entrypoint reads them."""
    numbered = []
    for name, value in environ.items():
        index = name.removeprefix("SPARK_JAVA_OPT_")
        if index != name and index.isdigit():
            numbered.append((int(index), value))
    return [value for _, value in sorted(numbered)]


def spark_command(argv: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """The command for ``argv``: Spark's driver or executor, or ``None`` to run ``keyorder argv``."""
    if not argv or argv[0] not in ("driver", "executor"):
        return None
    home = spark_home(environ)
    if argv[0] == "driver":
        bind = environ.get("SPARK_DRIVER_BIND_ADDRESS", "0.0.0.0")
        return [
            f"{home}/bin/spark-submit",
            "--conf",
            f"spark.driver.bindAddress={bind}",
            "--conf",
            f"spark.executorEnv.SPARK_DRIVER_POD_IP={bind}",
            "--deploy-mode",
            "client",
            *argv[1:],
        ]
    missing = [name for name in ("SPARK_EXECUTOR_MEMORY", *EXECUTOR_ENV.values()) if not environ.get(name)]
    if missing:
        raise EntrypointError(
            f"executor: {', '.join(missing)} not set (Spark on Kubernetes sets them in executor pods; "
            "run `keyorder ...` for anything else)"
        )
    java = java_executable(environ)
    memory = environ["SPARK_EXECUTOR_MEMORY"]
    classpath = ":".join(
        part for part in (environ.get("SPARK_CLASSPATH"), f"{home}/jars/*", environ.get("SPARK_DIST_CLASSPATH")) if part
    )
    arguments = [item for flag, name in EXECUTOR_ENV.items() for item in (flag, environ[name])]
    return [
        java,
        *_java_options(environ),
        f"-Xms{memory}",
        f"-Xmx{memory}",
        "-cp",
        classpath,
        EXECUTOR_BACKEND,
        *arguments,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        command = spark_command(arguments, os.environ)
    except EntrypointError as error:
        print(f"keyorder-spark-entrypoint: {error}", file=sys.stderr)
        return 2
    if command is None:
        from keyorder.cli import main as keyorder

        return keyorder(arguments)
    environ = dict(os.environ)
    environ.setdefault("SPARK_HOME", spark_home(environ))
    environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the image's venv: keyorder, the handler, pyspark
    sys.stdout.flush()
    os.execvpe(command[0], command, environ)  # replaces this process: Spark's signals reach the JVM
    return 0  # pragma: no cover - execvpe does not return
