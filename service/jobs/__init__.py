"""Training jobs the daemon knows (their loaders register their read plans) and the staging of their shards
in read order: ``registry`` (who reads what, where they stand), ``staging_plan`` (pure: which shards to stage
and evict) and ``stager`` (the copies)."""
