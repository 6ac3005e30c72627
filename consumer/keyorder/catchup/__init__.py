"""``keyorder catchup``: drain or replay a backlog in key order on Spark, then hand over to the pods.

Pods stop at the partition count and at what one pod's CPU allows. A catch-up job reads a fenced
range of offsets per partition with a Spark Python Data Source, brings each key's messages of a
partition to one Spark task (by a shuffle on the hash of the key within its partition, or by
reading whole partitions in one task: ``layout``) and calls the pod's own handler contract for
them one at a time in offset order. The guarantee is the pods': per key, in offset order within a
partition (``layout.ORDER_GUARANTEE``). Only after every message is accounted for does the driver
commit the fence for the group, so the live pods resume exactly where the job stopped.

Modules: ``positions`` (pure: where a range starts and ends), ``plan`` (pure: ranges, splits, key
statistics, verification), ``layout`` (pure: shuffle or by-partition, and the order both give),
``memory`` (pure: what a task's Python workers hold, in bytes), ``offsets`` (the driver's Kafka
queries and the final commit), ``datasource`` (the Spark data source), ``apply`` (the
per-Spark-partition handler loop), ``job`` (the driver: session, pipeline, progress, report) and
``command`` (the CLI).
"""
