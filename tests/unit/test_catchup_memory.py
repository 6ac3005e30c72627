"""A catch-up task's memory is bounded in bytes end to end: the handler loop's input, the reader's
consumers and chunks, and the executor memory the operator asks for (``keyorder.catchup.memory``)."""

from __future__ import annotations

import pyarrow
import pytest

from keyorder_operator.builders import build_catchup_job, catchup_job_name
from keyorder_operator.spec import parse_spec
from tests.unit.test_operator_catchup import as_the_kubelet_starts_it

VALUE = 100_000


def test_a_task_with_100_kb_values_stays_within_its_budget() -> None:
    """The real task function over Arrow batches of 48 MiB (480 messages of 100 KB each) with an 8 MiB
    look-ahead, in a fresh interpreter: its peak RSS grows by at most the look-ahead, one batch, one slice
    and the allocator's slack above the worker's own base. Turning a whole input batch into Python objects
    before admitting any of it (the old feeder) grew it by a second batch."""
    from keyorder.devtools.catchup_task_memory import measure

    report = measure(messages=1_000, value_bytes=VALUE, batch_bytes=48 << 20, lookahead_mb=8)

    from keyorder.catchup.memory import WORKER_BASE_MIB

    assert report["handled"] == 1_000
    assert report["growth_kib"] <= report["allowed_growth_kib"], report  # what the handler loop holds
    assert report["base_kib"] <= WORKER_BASE_MIB << 10, f"this machine's worker base is over the figure: {report}"
    assert report["peak_kib"] <= report["budget_mib"] << 10, report


def test_the_memory_probes_rows_carry_the_lane_the_reader_gives_them() -> None:
    """Review of issue 38, finding 11: the probe built lane_hash(key), a lane no reader gives since lanes are a
    key within its partition (record_lane), so its tasks did not route as real ones."""
    from keyorder.catchup.datasource import record_lane
    from keyorder.devtools.catchup_task_memory import TOPIC, batches

    first, *_ = batches(messages=40, value_bytes=10, batch_bytes=1 << 20)
    rows = zip(first.column("source").to_pylist(), first.column("key").to_pylist(), strict=True)
    assert first.column("lane").to_pylist() == [record_lane(TOPIC, source, key) for source, key in rows]


def test_input_batches_are_turned_into_messages_a_slice_of_bounded_bytes_at_a_time() -> None:
    from keyorder.catchup.apply import MESSAGE_OVERHEAD, batch_slices
    from keyorder.catchup.datasource import arrow_batch

    rows = [(0, 0, n, n, b"k", b"v" * VALUE, [], None, None, None) for n in range(40)]
    rows.append((0, 0, 1 << 20, 40, None, None, [], None, 40, 0))  # the end marker: no key, no value
    slices = list(batch_slices(arrow_batch(rows), 1 << 20))

    assert [row for piece in slices for row in piece.column("offset").to_pylist()] == list(range(41))
    for piece in slices:
        values = sum(len(v or b"") for v in piece.column("value").to_pylist())
        assert values + MESSAGE_OVERHEAD * (piece.num_rows - 1) <= 1 << 20 or piece.num_rows == 1
    big = [(0, 0, 0, 0, b"k", b"v" * (2 << 20), [], None, None, None)]
    assert [piece.num_rows for piece in batch_slices(arrow_batch(big), 1 << 20)] == [1]  # alone, still handled


def test_the_job_cuts_sparks_arrow_batches_by_bytes_unless_told_otherwise() -> None:
    from keyorder.catchup.job import memory_settings
    from keyorder.catchup.memory import ARROW_BATCH_BYTES

    assert memory_settings({}) == {"spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_BATCH_BYTES)}
    assert memory_settings({"spark.sql.execution.arrow.maxBytesPerBatch": "1048576"}) == {}


@pytest.mark.parametrize("partitions", [1, 2, 4, 8, 20, 21, 32, 64, 500])
def test_a_reader_task_of_any_number_of_partitions_stays_within_its_bytes(partitions: int) -> None:
    from keyorder.catchup.datasource import reader_shares
    from keyorder.catchup.memory import READER_TASK_BYTES

    shares = reader_shares(partitions)

    assert 1 <= shares.open_at_once <= partitions
    assert shares.bytes() <= READER_TASK_BYTES
    assert shares.prefetch_kbytes >= 512 and shares.chunk_bytes >= 512 << 10  # still reads in useful amounts


def test_a_reader_task_opens_at_most_its_share_of_partitions_at_once_each_in_offset_order() -> None:
    """32 partitions in one task: never more than ``open_at_once`` streams opened and not ended (the old
    reader opened all 32 consumers and held a chunk of each before the first chunk moved); every stream's
    chunks in their own order, every chunk once."""
    from keyorder.catchup.datasource import merge_chunks, reader_shares

    open_now, most = set(), 0

    def stream(index: int, chunks: int):
        for number in range(chunks):
            # (lane, source, progress, offset, ..., marker_read): records of ``index``, progress rising
            yield [(0, index, number * 10, number, b"k", b"v", [], None, None, None)]
        open_now.discard(index)

    def opener(index: int):
        def open_stream():
            nonlocal most
            open_now.add(index)  # read_task's openers create and assign a consumer here
            most = max(most, len(open_now))
            return stream(index, 3 + index % 4)

        return open_stream

    shares = reader_shares(32, budget=12 << 20)
    merged = list(merge_chunks([opener(index) for index in range(32)], shares.open_at_once))

    assert 1 < shares.open_at_once < 32
    assert most <= shares.open_at_once
    for index in range(32):
        assert [chunk[0][3] for chunk in merged if chunk[0][1] == index] == list(range(3 + index % 4))


def test_reader_chunks_are_cut_by_bytes() -> None:
    from keyorder.catchup.datasource import _chunks, row_bytes

    rows = [(0, 0, n, n, b"k", b"v" * VALUE, [], None, None, None) for n in range(100)]
    chunks = list(_chunks(iter(rows), 2_000, 1 << 20))

    assert [row for chunk in chunks for row in chunk] == rows
    assert all(sum(map(row_bytes, chunk[:-1])) < 1 << 20 for chunk in chunks)  # the last row closes it


def spec_with(env: list[dict], spark_conf: dict | None = None):
    return parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
            "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle", "env": env},
            "catchup": {
                "enabled": True,
                "image": "reg/orders-spark:1",
                "master": "spark://spark-master:7077",
                "executors": 2,
                "executorCores": 3,
                "sparkConf": {"spark.authenticate.secret": "s3", **(spark_conf or {})},
            },
        }
    )


def overhead_and_lookahead(spec) -> tuple[int, int]:
    """The executor memory overhead (MiB) the operator's Job asks for, and the look-ahead (MiB) that Job's
    ``keyorder catchup`` runs with, read as it reads them (its arguments and environment)."""
    from keyorder.catchup.settings import CatchupConfig
    from keyorder.cli import build_parser
    from keyorder.config import load_config

    owner = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    job = build_catchup_job(spec, owner, catchup_job_name("orders", 1700000000), "orders:0=10")
    args, env = as_the_kubelet_starts_it(job["spec"]["template"]["spec"]["containers"][0])
    config = load_config(CatchupConfig, vars(build_parser("catchup").parse_args(args)), environ=env)
    overhead = config.spark_settings()["spark.executor.memoryOverhead"]
    assert overhead.endswith("m")
    return int(overhead[:-1]), config.task_lookahead_mb


def test_the_executor_memory_holds_a_look_ahead_set_in_the_handlers_env() -> None:
    """A look-ahead of 512 MiB set through spec.handler.env reaches the job, and the executors' memory
    overhead holds it for each of their 3 task slots (the old figure, 160 MiB per Python worker and a fixed
    64 MiB look-ahead, did not)."""
    overhead, lookahead = overhead_and_lookahead(spec_with([{"name": "KEYORDER_TASK_LOOKAHEAD_MB", "value": "512"}]))

    assert lookahead == 512
    assert overhead >= 384 + 3 * (2 * 160 + 512 + 64 + 8)  # JVM, per task: two workers, look-ahead, reader, batch
    from keyorder.catchup.memory import executor_memory_overhead_mib

    assert overhead == executor_memory_overhead_mib(3, lookahead)


def test_the_executor_memory_follows_the_default_look_ahead_and_a_given_overhead_wins() -> None:
    from keyorder.catchup.memory import executor_memory_overhead_mib

    overhead, lookahead = overhead_and_lookahead(spec_with([]))
    assert overhead == executor_memory_overhead_mib(3, lookahead) and lookahead == 64
    given, _ = overhead_and_lookahead(spec_with([], {"spark.executor.memoryOverhead": "4096m"}))
    assert given == 4096


def test_the_executor_memory_follows_the_executor_cores_and_arrow_batch_bound_given_in_spark_conf() -> None:
    """Review of issue 38, finding 6. Before: the overhead counted spec.catchup.executorCores (3) and the job's
    8 MiB Arrow batch whatever sparkConf said, so 6 cores with 64 MiB batches were given room for half the
    tasks, each with an eighth of its input batch."""
    from keyorder.catchup.memory import executor_memory_overhead_mib, spark_bytes

    given = {"spark.executor.cores": "6", "spark.sql.execution.arrow.maxBytesPerBatch": "64m"}
    overhead, lookahead = overhead_and_lookahead(spec_with([], given))
    assert overhead == executor_memory_overhead_mib(6, lookahead, 64 << 20)
    assert overhead > executor_memory_overhead_mib(3, lookahead) + 3 * 56  # 3 more tasks, 56 MiB more batch each
    assert [spark_bytes(v) for v in ("64m", "8388608", "1g", " 2K ", "1.5m", "lots")] == [
        64 << 20,
        8 << 20,
        1 << 30,
        2048,
        None,
        None,
    ]


def local_job_resources(resources: dict, spark_conf: dict | None = None) -> dict:
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
            "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
            "catchup": {
                "enabled": True,
                "image": "reg/orders-spark:1",
                "master": "local[4]",
                "resources": resources,
                "sparkConf": spark_conf or {},
            },
        }
    )
    owner = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    job = build_catchup_job(spec, owner, catchup_job_name("orders", 1700000000), "orders:0=10")
    return job["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_a_local_master_job_pod_gets_the_memory_of_its_driver_and_tasks_unless_one_is_given() -> None:
    """Review of issue 38, finding 5. Before: on local[*] (the default) the Job pod's memory was whatever
    spec.catchup.resources said, unchecked: without a figure the pod had no request, however many tasks'
    Python workers ran in it. Now, when no memory is given: the driver JVM (spark.driver.memory and Spark's
    overhead), the driver's Python and 4 tasks' workers, as request and limit."""
    from keyorder.catchup.memory import SPARK_OVERHEAD_MIB, WORKER_BASE_MIB, task_python_mib

    expected = 1024 + SPARK_OVERHEAD_MIB + WORKER_BASE_MIB + 4 * task_python_mib(64)
    resources = local_job_resources({"requests": {"cpu": "4"}})
    assert resources == {
        "requests": {"cpu": "4", "memory": f"{expected}Mi"},
        "limits": {"memory": f"{expected}Mi"},
    }
    bigger_driver = local_job_resources({}, {"spark.driver.memory": "4g"})
    assert bigger_driver["limits"]["memory"] == f"{expected + 3 * 1024}Mi"
    given = {"requests": {"memory": "2Gi"}, "limits": {"cpu": "4"}}
    assert local_job_resources(given) == given  # the user's figure is kept


def test_arrow_is_what_the_slices_are_cut_from() -> None:
    """A pandas frame (the unit tests' batches) is converted to Arrow first; an Arrow batch is used as is."""
    from keyorder.catchup.apply import as_arrow
    from keyorder.catchup.datasource import arrow_batch

    batch = arrow_batch([(0, 0, 0, 0, b"k", b"v", [], None, None, None)])
    assert as_arrow(batch) is batch
    assert isinstance(as_arrow(batch.to_pandas()), pyarrow.RecordBatch)
