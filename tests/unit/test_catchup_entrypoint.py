"""The catch-up image's entrypoint: Spark's driver and executor commands, ``keyorder`` otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keyorder.catchup.entrypoint import EXECUTOR_BACKEND, EntrypointError, spark_command, spark_home

EXECUTOR_POD_ENV = {
    "SPARK_HOME": "/spark",
    "JAVA_HOME": "/jre",
    "SPARK_EXECUTOR_MEMORY": "2g",
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@driver-svc:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "4",
    "SPARK_APPLICATION_ID": "spark-app-1",
    "SPARK_EXECUTOR_POD_IP": "10.0.0.7",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_NAME": "orders-exec-3",
    "SPARK_JAVA_OPT_10": "-Dlast=1",
    "SPARK_JAVA_OPT_2": "-Dsecond=1",
    "SPARK_JAVA_OPT_0": "-Dfirst=1",
}


@pytest.mark.parametrize("argv", [[], ["catchup", "--plan"], ["run"], ["--version"], ["executors"]])
def test_anything_but_driver_or_executor_runs_keyorder(argv: list[str]) -> None:
    assert spark_command(argv, {"SPARK_HOME": "/spark"}) is None


def test_an_executor_pod_starts_the_kubernetes_executor_backend() -> None:
    assert spark_command(["executor"], EXECUTOR_POD_ENV) == [
        "/jre/bin/java",
        "-Dfirst=1",
        "-Dsecond=1",
        "-Dlast=1",  # SPARK_JAVA_OPT_<n> in numeric order
        "-Xms2g",
        "-Xmx2g",
        "-cp",
        "/spark/jars/*",
        EXECUTOR_BACKEND,
        "--driver-url",
        "spark://CoarseGrainedScheduler@driver-svc:7078",
        "--executor-id",
        "3",
        "--cores",
        "4",
        "--app-id",
        "spark-app-1",
        "--hostname",
        "10.0.0.7",
        "--resourceProfileId",
        "0",
        "--podName",
        "orders-exec-3",
    ]


def test_a_cluster_mode_driver_pod_runs_spark_submit_in_client_mode() -> None:
    argv = ["driver", "--properties-file", "/opt/spark/conf/spark.properties", "local:///app/__main__.py", "--plan"]
    command = spark_command(argv, {"SPARK_HOME": "/spark", "SPARK_DRIVER_BIND_ADDRESS": "10.0.0.9"})
    assert command == [
        "/spark/bin/spark-submit",
        "--conf",
        "spark.driver.bindAddress=10.0.0.9",
        "--conf",
        "spark.executorEnv.SPARK_DRIVER_POD_IP=10.0.0.9",
        "--deploy-mode",
        "client",
        *argv[1:],
    ]


def test_an_executor_without_sparks_variables_is_named() -> None:
    with pytest.raises(EntrypointError, match="SPARK_DRIVER_URL, SPARK_EXECUTOR_ID"):
        spark_command(["executor"], {"SPARK_HOME": "/spark", "SPARK_EXECUTOR_MEMORY": "1g"})


def test_spark_home_defaults_to_the_installed_pyspark() -> None:
    home = Path(spark_home({}))
    assert (home / "bin" / "spark-submit").exists() and any((home / "jars").glob("spark-kubernetes*.jar"))


def entrypoint(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "keyorder-spark-entrypoint"
    return subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=120, env=env)


def test_the_installed_entrypoint_passes_keyorder_commands_through() -> None:
    result = entrypoint("--version")
    assert result.returncode == 0 and "keyorder" in (result.stdout + result.stderr).lower()


@pytest.mark.slow
def test_the_installed_entrypoint_starts_a_real_executor_jvm(tmp_path: Path) -> None:
    """The executor command runs the real backend class from pyspark's jars: it parses Spark's arguments
    and tries to reach the driver (here none listens), instead of `keyorder executor` exiting at once."""
    import os
    import socket

    with socket.socket() as probe:  # a free port with no driver behind it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPARK_")},
        **{k: v for k, v in EXECUTOR_POD_ENV.items() if k not in ("SPARK_HOME", "JAVA_HOME")},
        "SPARK_EXECUTOR_MEMORY": "256m",
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_JAVA_OPT_0": "-Dspark.rpc.numRetries=1",
    }
    result = entrypoint("executor", env=env)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "ClassNotFoundException" not in output and "Unrecognized" not in output, output[-2000:]
    assert f"127.0.0.1:{port}" in output, output[-3000:]  # it tried to register with the driver
