"""Which sample goes where: the pure index math of the loader (nothing here reads data).

Shuffled orders and their permutations, the partition of a stream over ranks, workers and batches, and
the mixing schedule of a mixture. Imports nothing else of ``ferry.client``."""
