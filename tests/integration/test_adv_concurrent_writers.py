"""Concurrent writers as a property (``contracts/writers.py``), on every store ferry supports.

Every emulator enforces the preconditions ferry sends (moto only request by request: its put_object
checks If-Match, then writes, with no lock between, so two PUTs at the same instant can both pass there).
The same property with every racing ``ferry sync`` copying as Ray tasks is in ``test_ray_sync.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from contracts.writers import CLOUD_ROUNDS, ROUNDS, S3_ROUNDS, concurrent_writers


class ConcurrentWriters:
    """The property on one store (a subclass names its conftest backend fixture)."""

    backend_name: ClassVar[str]
    rounds: ClassVar[int] = ROUNDS

    @pytest.mark.slow
    @pytest.mark.timeout(900)
    def test_concurrent_writers(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        backend = request.getfixturevalue(f"{self.backend_name}_backend")
        concurrent_writers(backend.base, backend.storage_options, backend.env, tmp_path, self.rounds)


class TestConcurrentWritersOnFile(ConcurrentWriters):
    backend_name = "file"


class TestConcurrentWritersOnS3(ConcurrentWriters):
    backend_name = "s3"
    rounds = S3_ROUNDS


@pytest.mark.soak
class TestConcurrentWritersOnS3Long(ConcurrentWriters):
    backend_name = "s3"


class TestConcurrentWritersOnGcs(ConcurrentWriters):
    backend_name = "gcs"
    rounds = CLOUD_ROUNDS


class TestConcurrentWritersOnAzure(ConcurrentWriters):
    backend_name = "azure"
    rounds = CLOUD_ROUNDS
