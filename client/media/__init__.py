"""Reading datasets packed with media: packed sequences with their media items (see docs/guides/multimodal.md)."""
