"""Where datasets live: fsspec stores, conditional (compare-and-swap) writes, publishing a manifest, and
``s3_get``: one small S3 read without botocore (a manifest, before any storage client exists), and ``s3_ranged``:
the loader's ranged S3 reads on kept-alive connections."""
