"""What the operator's lag reader processes cost in memory: the figure the chart's memory limit is sized from.

The operator reads Kafka in one child process per namespace with OrderedConsumers (``lag_reader.LagReaders``),
each holding one admin client per distinct Kafka configuration of the namespace. This starts a real broker
(``keyorder.devtools.embedded.EmbeddedBroker``, Tansu) with one 3-partition topic, gives ``--namespaces``
namespaces ``--configurations`` resources each (distinct ``client.id``, so distinct configurations), samples
every resource once (the clients are built and connected, as between two polls), then reads each child's
``/proc/<pid>/smaps_rollup``: private memory (``Private_Clean`` + ``Private_Dirty``: what each child adds
to the container, the interpreter's shared libraries counted once), PSS and RSS, and ``VmPeak`` (the
address space, against the child's ``RLIMIT_AS``).

    .venv/bin/python -m tools.lag_reader_memory --namespaces 10 --configurations 1
    .venv/bin/python -m tools.lag_reader_memory --namespaces 1 --configurations 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def memory_kib(pid: int) -> dict[str, int]:
    """A process's memory from /proc, in kB."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    fields = {name.strip(): int(value.split()[0]) for name, value in (line.split(":", 1) for line in rollup)}
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {
        "private": fields["Private_Clean"] + fields["Private_Dirty"],
        "private_dirty": fields["Private_Dirty"],
        "pss": fields["Pss"],
        "rss": fields["Rss"],
        "vm_peak": int(status["VmPeak"].split()[0]),
    }


def measure(bootstrap: str, namespaces: int, configurations: int) -> dict[str, object]:
    from keyorder.devtools.loadgen import create_topics
    from keyorder_operator.lag_reader import LagReaders

    create_topics(bootstrap, ["memory"], 3)
    readers = LagReaders()
    sources = [
        readers.source(f"tenant-{namespace}", {"bootstrap.servers": bootstrap, "client.id": f"resource-{index}"})
        for namespace in range(namespaces)
        for index in range(configurations)
    ]
    try:
        for source in sources:
            source.sample(["memory"], "memory-group", time.time())
        time.sleep(2.0)  # the clients' background threads settle
        children = []
        for namespace in range(namespaces):
            reader = readers.reader(f"tenant-{namespace}")
            assert reader is not None and reader.pid is not None
            children.append(memory_kib(reader.pid))
    finally:
        for source in sources:
            source.close()
    private = [child["private"] for child in children]
    return {
        "namespaces": namespaces,
        "configurations_per_namespace": configurations,
        "child_private_kib_median": statistics.median(private),
        "child_private_kib_max": max(private),
        "children_private_kib_total": sum(private),
        "children_pss_kib_total": sum(child["pss"] for child in children),
        "child_rss_kib_median": statistics.median(child["rss"] for child in children),
        "child_vm_peak_kib_max": max(child["vm_peak"] for child in children),
        "parent": memory_kib(int(Path("/proc/self/stat").read_text().split()[0])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=10, help="namespaces, each with its own child")
    parser.add_argument("--configurations", type=int, default=1, help="distinct configurations per namespace")
    parser.add_argument("--bootstrap", help="an existing broker (default: start an embedded Tansu broker)")
    arguments = parser.parse_args(argv)
    if arguments.bootstrap:
        result = measure(arguments.bootstrap, arguments.namespaces, arguments.configurations)
    else:
        from keyorder.devtools.embedded import EmbeddedBroker

        with EmbeddedBroker() as broker:
            result = measure(broker.bootstrap, arguments.namespaces, arguments.configurations)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
