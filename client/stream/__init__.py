"""What training iterates: TokenDataset, MixedDataset and TokenLoader, reading samples out of shards
into batches, batches made ready ahead of the loop, and provenance (``ferry trace``)."""
