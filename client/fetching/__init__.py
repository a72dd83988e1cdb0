"""Getting shard bytes onto the node: fetches from the replicas, the node cache, frames, and the
background threads that do the fetching. Imports only ``ferry.client``'s shared modules (checks, stats)."""
