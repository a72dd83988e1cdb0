"""Saved loader state: its format and fingerprint, resuming (and replanning) from it, torch DCP
checkpoints, and ``ferry state``."""
