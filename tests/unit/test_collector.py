"""The pod's garbage-collector setting (``keyorder.collector``, ``--gc-threshold``, off by default): what
``keyorder run`` and each worker process of the process executor apply."""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Iterator

import pytest

from keyorder.adapters.handlers import load_for_worker_process
from keyorder.collector import set_first_threshold
from keyorder.config import ConfigError, load_run_config
from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.process_pool import ProcessWorkerPool
from keyorder.engine.worker_pools import Completions
from keyorder.message import Message
from keyorder.pod import Pod
from tests.conftest import wait_until
from tests.unit.test_workers import Partition

REQUIRED = {
    "topics": "t",
    "group_id": "g",
    "bootstrap_servers": "127.0.0.1:9",
    "handler": "tests.unit.process_handlers:record_gc_threshold",
}


@pytest.fixture
def pythons_thresholds() -> Iterator[tuple[int, int, int]]:
    """This test process's thresholds, put back afterwards (the setting is the process's)."""
    before = gc.get_threshold()
    gc.set_threshold(700, 11, 12)
    yield 700, 11, 12
    gc.set_threshold(*before)


def test_the_first_threshold_is_set_keeping_the_older_two_and_zero_keeps_pythons(pythons_thresholds):
    set_first_threshold(0)
    assert gc.get_threshold() == pythons_thresholds
    set_first_threshold(50_000)
    assert gc.get_threshold() == (50_000, 11, 12)


def test_the_flag_keeps_pythons_threshold_by_default_and_refuses_a_negative_one_naming_it():
    assert load_run_config(REQUIRED, environ={}).gc_threshold == 0
    assert load_run_config(REQUIRED, environ={"KEYORDER_GC_THRESHOLD": "10000"}).gc_threshold == 10_000
    with pytest.raises(ConfigError, match="--gc-threshold / KEYORDER_GC_THRESHOLD"):
        load_run_config({**REQUIRED, "gc_threshold": -1}, environ={})


def test_a_worker_process_sets_its_collector_from_the_pods_config(tmp_path, monkeypatch):
    """The pod hands ``--gc-threshold`` to its worker processes, and each applies it before the handler runs."""
    record_file = tmp_path / "records.txt"
    monkeypatch.setenv("KEYORDER_TEST_RECORD_FILE", str(record_file))
    flags = {"executor": "process", "gc_threshold": 12_345, "workers": 1, "on_exhausted": "block"}
    config = load_run_config({**REQUIRED, **flags}, environ={})
    pod = Pod(config, environ={}, serve_http=False)
    load = pod.pool._load  # the loader the pod built for its processes: run it in a real one
    assert isinstance(load, functools.partial) and load.func is load_for_worker_process
    completions = Completions()
    pool = ProcessWorkerPool(load, 1, RetryPolicy(max_attempts=1), None, completions)
    pool.start()
    try:
        pool.submit([Delivery(Message("t", 0, 0, b"k", b"0"), b"k", Partition(), time.monotonic())])
        wait_until(lambda: record_file.exists() and record_file.read_text().strip(), 30, "the handler's line")
    finally:
        pool.stop(5)
    (line,) = record_file.read_text().splitlines()
    assert line.split()[0] == "gc" and int(line.split()[2]) == 12_345
