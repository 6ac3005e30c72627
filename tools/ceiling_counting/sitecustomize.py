"""Loaded by ``tools/ceiling_probe.py --count`` in the pod process (through ``PYTHONPATH``): counts the
pod's ``consume`` calls (those that returned fewer messages than asked, and the time spent in them)
and its pause/resume calls, and writes the counts when the process exits. A probe, never shipped."""

import atexit
import os
import time
from collections import Counter

if os.environ.get("CEILING_PROBE_COUNTS"):
    import keyorder.adapters.kafka_source as kafka_source

    counts: Counter = Counter()
    timeline: list = []
    consume, pause, resume = (
        kafka_source.KafkaSource.consume,
        kafka_source.KafkaSource.pause,
        kafka_source.KafkaSource.resume,
    )

    def counted_consume(self, max_messages, timeout):
        began = time.perf_counter()
        records = consume(self, max_messages, timeout)
        took = time.perf_counter() - began
        timeline.append(("consume", round(began, 4), round(took, 4), len(records), max_messages))
        counts["calls"] += 1
        counts["messages"] += len(records)
        counts["seconds"] += took
        if len(records) < max_messages:
            counts["short calls"] += 1
            counts["seconds in short calls"] += took
        return records

    def counted_pause(self, partitions):
        timeline.append(("pause", round(time.perf_counter(), 4), sorted(partitions)))
        counts["pauses"] += len(partitions)
        return pause(self, partitions)

    def counted_resume(self, partitions):
        timeline.append(("resume", round(time.perf_counter(), 4), sorted(partitions)))
        counts["resumes"] += len(partitions)
        return resume(self, partitions)

    commit, committed_callback = kafka_source.KafkaSource.commit, kafka_source.KafkaSource._committed_callback

    def counted_commit(self, offsets, asynchronous):
        timeline.append(("commit", round(time.perf_counter(), 4), sorted((k, v[0]) for k, v in offsets.items())))
        return commit(self, offsets, asynchronous)

    def counted_committed_callback(self, error, partitions):
        confirmed = sorted((tp.partition, tp.offset) for tp in partitions or ())
        timeline.append(("committed", round(time.perf_counter(), 4), confirmed))
        return committed_callback(self, error, partitions)

    kafka_source.KafkaSource.commit = counted_commit
    kafka_source.KafkaSource._committed_callback = counted_committed_callback
    kafka_source.KafkaSource.consume = counted_consume
    kafka_source.KafkaSource.pause = counted_pause
    kafka_source.KafkaSource.resume = counted_resume

    def write() -> None:
        directory = os.environ["CEILING_PROBE_COUNTS"]
        rounded = {name: round(value, 2) if isinstance(value, float) else value for name, value in counts.items()}
        with open(os.path.join(directory, f"counts-{os.getpid()}.txt"), "w") as file:
            file.write(repr(rounded))
        with open(os.path.join(directory, f"timeline-{os.getpid()}.txt"), "w") as file:
            file.writelines(repr(event) + "\n" for event in timeline)

    atexit.register(write)
