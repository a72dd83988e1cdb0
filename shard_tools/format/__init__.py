"""What ferry writes, as bytes: shard files (header, seekable frames, digests), manifests, and the
Megatron .bin/.idx format that ferry reads and exports. Storage-agnostic: nothing here opens a URL."""
