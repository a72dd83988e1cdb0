"""``ferry pack``: planning units of input, packing them into shards in pool workers, and merging parts.

Not named ``pack``: ``ferry.shard_tools.pack`` is the packing function."""
