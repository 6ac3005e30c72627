"""Catch-up's Spark session: authenticated, encrypted and without a UI unless asked (issue 37, finding 5).

``security_settings`` is pure; ``spark_session`` is checked with a recording stand-in for
``SparkSession.builder`` (no JVM), so the settings a real session would start with are asserted
here. tests/spark/ runs real sessions with them: local (test_catchup_spark) and a standalone cluster
that requires authentication (test_standalone_cluster).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from keyorder.catchup import job
from keyorder.catchup.job import SparkSettingsError, security_settings, spark_session
from keyorder.catchup.settings import SPARK_SECURITY_DEFAULTS, CatchupConfig

SECURE = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.io.encryption.enabled": "true",
    "spark.ui.enabled": "false",
}


@pytest.mark.parametrize("master", ["local[2]", "local[*]", "k8s://https://kubernetes.default.svc", "yarn"])
def test_authentication_and_encryption_are_on_and_the_ui_off_where_spark_makes_the_secret(master: str) -> None:
    assert SPARK_SECURITY_DEFAULTS == SECURE
    assert security_settings(master, {}, ui=False) == SECURE


def test_what_the_user_chose_is_kept_and_the_ui_comes_on_when_asked() -> None:
    given = {"spark.io.encryption.enabled": "false", "spark.ui.enabled": "true"}
    added = security_settings("local[2]", given, ui=False)
    assert "spark.io.encryption.enabled" not in added and "spark.ui.enabled" not in added
    assert added["spark.authenticate"] == "true"
    assert security_settings("local[2]", {}, ui=True)["spark.ui.enabled"] == "true"


def test_a_standalone_master_needs_the_secret_its_cluster_shares() -> None:
    with pytest.raises(SparkSettingsError, match=r"spark\.authenticate\.secret=.*spark\.authenticate=false"):
        security_settings("spark://10.0.0.5:7077", {}, ui=False)
    added = security_settings("spark://10.0.0.5:7077", {"spark.authenticate.secret": "shared"}, ui=False)
    assert added == SECURE  # the given secret is used as given, not repeated
    # explicitly unauthenticated (the user's choice, e.g. an old cluster without a secret): allowed
    unauthenticated = security_settings("spark://10.0.0.5:7077", {"spark.authenticate": "false"}, ui=False)
    assert unauthenticated == {"spark.io.encryption.enabled": "true", "spark.ui.enabled": "false"}


@pytest.mark.parametrize(
    ("host", "bind", "expected"),
    [
        ("10.1.2.3", "0.0.0.0", "10.1.2.3"),  # the operator's driver: host $(POD_IP), bound to every interface
        ("fd00::7", "::", "fd00::7"),
        ("driver-svc.ns.svc", "0.0.0.0", None),  # a Service name cannot be bound: leave the wildcard
        ("10.1.2.3", "10.1.2.3", None),  # already narrow
    ],
)
def test_the_driver_listens_on_its_own_address_instead_of_every_interface(
    host: str, bind: str, expected: str | None
) -> None:
    added = security_settings(
        "k8s://https://kubernetes.default.svc", {"spark.driver.host": host, "spark.driver.bindAddress": bind}, False
    )
    assert added.get("spark.driver.bindAddress") == expected


class RecordingBuilder:
    """``SparkSession.builder`` without a JVM: records the master and settings a session would start with."""

    def __init__(self) -> None:
        self.settings: dict[str, str] = {}
        self.started = 0

    def appName(self, name: str) -> RecordingBuilder:
        return self

    def master(self, master: str) -> RecordingBuilder:
        self.settings["spark.master"] = master
        return self

    def config(self, name: str, value: str) -> RecordingBuilder:
        self.settings[name] = value
        return self

    def getOrCreate(self) -> Any:
        self.started += 1

        class Context:
            def setLogLevel(self, level: str) -> None:
                pass

        class Session:
            sparkContext = Context()

        return Session()


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch) -> RecordingBuilder:
    from pyspark.sql import SparkSession

    recording = RecordingBuilder()
    monkeypatch.setattr(SparkSession, "builder", recording)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    return recording


def catchup_config(**settings: Any) -> CatchupConfig:
    return CatchupConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", handler="m:f", **settings)


def test_the_session_the_job_starts_is_authenticated_encrypted_and_without_ui(
    builder: RecordingBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job, "_launch_settings", lambda: {})
    spark_session(catchup_config(master="local[2]"))
    assert {name: builder.settings.get(name) for name in SECURE} == SECURE


def test_spark_submit_settings_win_over_the_defaults_and_spark_ui_turns_the_ui_on(
    builder: RecordingBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched = {"spark.master": "local[2]", "spark.network.crypto.enabled": "false"}  # spark-submit --conf
    monkeypatch.setattr(job, "_launch_settings", lambda: launched)
    spark_session(catchup_config(master="local[2]", spark_ui=True))
    assert "spark.network.crypto.enabled" not in builder.settings  # spark-submit's value stands
    assert builder.settings["spark.ui.enabled"] == "true" and builder.settings["spark.authenticate"] == "true"


def test_a_standalone_session_without_the_secret_is_refused_before_it_starts(
    builder: RecordingBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job, "_launch_settings", lambda: {})
    with pytest.raises(SparkSettingsError, match="KEYORDER_SPARK_CONF"):
        spark_session(catchup_config(master="spark://127.0.0.1:7077"))
    assert builder.started == 0
    spark_session(catchup_config(master="spark://127.0.0.1:7077", spark_conf=["spark.authenticate.secret=s3"]))
    assert builder.started == 1
    assert builder.settings["spark.authenticate.secret"] == "s3" and builder.settings["spark.authenticate"] == "true"
