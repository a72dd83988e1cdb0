"""Where datasets live: fsspec stores, conditional (compare-and-swap) writes, and publishing a manifest."""
