"""Where datasets live: fsspec stores, conditional (compare-and-swap) writes, publishing a manifest, and
``s3_get``: one small S3 read without botocore (a manifest, before any storage client exists)."""
