"""Transfer: do and count. ``executor`` and ``slots`` (a bounded, pausable pool of shard jobs; outcomes from
the error tree), ``copier`` (where a copy runs: this thread, or a Ray task: ``ray_copier``, ``ray_tasks``,
``governor``), ``transfer`` (one shard copy: which path) over ``hashed_io`` (the one read-hash-write loop),
``local_copy``, ``object_store``, ``s3_presigned`` and ``http_pool``; ``bandwidth`` (token
buckets) and ``stats`` (live counters).

It knows shards and locations, not datasets' versions: it never imports ``ferry.service.replication``.
"""
