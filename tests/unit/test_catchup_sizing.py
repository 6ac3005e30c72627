"""sizing: the cores a catch-up run gets, and how long it waits for its executors."""

from __future__ import annotations

import pytest

from keyorder.catchup.sizing import RegistrationWait, expected_cores, is_local_master, local_master


@pytest.mark.parametrize(
    ("master", "limit", "available", "expected"),
    [
        ("local[*]", 2.0, 64, "local[2]"),  # a Job pod limited to 2 CPUs on a 64-core node
        ("local[*]", 1.5, 64, "local[2]"),
        ("local[*]", 0.25, 64, "local[1]"),
        ("local[*]", None, 8, "local[8]"),  # no limit: the CPUs the process may run on
        ("local[*,3]", 2.0, 64, "local[2,3]"),
        ("local[4]", 2.0, 64, "local[4]"),  # an explicit count is the user's
        ("local", 2.0, 64, "local"),
        ("spark://master:7077", 2.0, 64, "spark://master:7077"),
    ],
)
def test_local_star_means_the_containers_cpu_limit(master: str, limit, available: int, expected: str) -> None:
    assert local_master(master, limit, available) == expected


@pytest.mark.parametrize(
    ("master", "conf", "cores"),
    [
        ("local[3]", {}, 3),
        ("local", {}, 1),
        ("local[*]", {}, None),
        ("local[2, 5]", {}, 2),
        ("local-cluster[2,3,1024]", {}, 6),  # 2 workers of 3 cores: was "the cluster's free cores"
        ("k8s://https://api", {"spark.executor.instances": "4", "spark.executor.cores": "2"}, 8),
        ("k8s://https://api", {"spark.executor.instances": "4"}, 4),
        ("yarn", {"spark.executor.instances": "3", "spark.executor.cores": "2"}, 6),
        ("spark://m:7077", {"spark.executor.instances": "4", "spark.cores.max": "6"}, 6),  # standalone: cores.max
        ("spark://m:7077", {}, None),  # every free core of the cluster: unknown until they register
        (
            "k8s://https://api",
            {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.maxExecutors": "5"},
            5,
        ),
        ("k8s://https://api", {"spark.dynamicAllocation.enabled": "true"}, None),
        ("k8s://https://api", {"spark.executor.instances": "zero"}, None),
    ],
)
def test_the_cores_a_job_asked_for(master: str, conf: dict, cores) -> None:
    assert expected_cores(master, conf)[0] == cores


def test_it_waits_for_the_cores_asked_for_and_cuts_one_partition_per_core() -> None:
    wait = RegistrationWait(expected=8, started=0.0, timeout=120)
    assert not wait.done(0, 1.0)
    assert not wait.done(2, 5.0)  # the old code cut max(registered, 2) = 2 partitions here
    assert wait.done(8, 9.0)
    assert wait.key_partitions(8) == 8
    assert "all registered" in wait.describe(8, 9.0)


def test_after_the_bound_it_starts_with_the_partitions_asked_for_and_says_so() -> None:
    wait = RegistrationWait(expected=8, started=0.0, timeout=30)
    assert not wait.done(2, 29.0)
    assert wait.done(2, 30.0)
    assert wait.key_partitions(2) == 8  # late executors take the queued tasks
    assert "only 2 registered" in wait.describe(2, 30.0)


def test_without_a_count_it_waits_for_the_registrations_to_settle() -> None:
    wait = RegistrationWait(expected=None, started=0.0, timeout=120, settle=3)
    assert not wait.done(0, 10.0)  # no executor yet
    assert not wait.done(2, 11.0)
    assert not wait.done(4, 12.0)
    assert not wait.done(4, 14.0)
    assert wait.done(4, 15.0)  # none came for 3 s
    assert wait.key_partitions(4) == 4


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[2,3]", True),
        ("local[*,3]", True),
        ("spark://m:7077", False),
        ("k8s://https://api", False),
        ("yarn", False),
        ("localhost", False),
        ("local-cluster[2,1,1024]", False),  # executors in JVMs of their own, registering like a cluster's
        ("local[2", False),
    ],
)
def test_every_local_form_is_local(master: str, local: bool) -> None:
    """local[n,f] too: the key-partition wait treated it as a cluster, found no executors and waited its
    whole bound."""
    assert is_local_master(master) is local
