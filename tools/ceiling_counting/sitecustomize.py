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
    consume, pause, resume = (
        kafka_source.KafkaSource.consume,
        kafka_source.KafkaSource.pause,
        kafka_source.KafkaSource.resume,
    )

    def counted_consume(self, max_messages, timeout):
        began = time.perf_counter()
        records = consume(self, max_messages, timeout)
        took = time.perf_counter() - began
        counts["calls"] += 1
        counts["messages"] += len(records)
        counts["seconds"] += took
        if len(records) < max_messages:
            counts["short calls"] += 1
            counts["seconds in short calls"] += took
        return records

    def counted_pause(self, partitions):
        counts["pauses"] += len(partitions)
        return pause(self, partitions)

    def counted_resume(self, partitions):
        counts["resumes"] += len(partitions)
        return resume(self, partitions)

    kafka_source.KafkaSource.consume = counted_consume
    kafka_source.KafkaSource.pause = counted_pause
    kafka_source.KafkaSource.resume = counted_resume

    def write() -> None:
        directory = os.environ["CEILING_PROBE_COUNTS"]
        rounded = {name: round(value, 2) if isinstance(value, float) else value for name, value in counts.items()}
        with open(os.path.join(directory, f"counts-{os.getpid()}.txt"), "w") as file:
            file.write(repr(rounded))

    atexit.register(write)
