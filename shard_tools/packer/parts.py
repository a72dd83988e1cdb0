"""Fan-out without a cluster manager: part records of ``ferry pack --part I/N`` and their merge.

Part ``I`` of ``N`` packs the units ``i`` with ``i % N == I`` and stores its shard rows as
``parts/<run-id>/part-I-of-N.json`` at the output. The run id is a digest of the plan (units,
dataset header, packing parameters, N), so every node computes the same one from the same
command line, and ``--merge`` can check that all parts belong together. Merging orders the
rows by unit, exactly as a local pack does, so the published version is byte-identical.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ManifestError, UsageError
from ..format.digest import digest_bytes
from ..format.manifest import ShardInfo, Tokenizer
from ..format.policy import MediaPolicy
from ..sources import Unit
from ..storage.store import Location
from .packunit import Job

__all__ = ["DatasetHeader", "PartRecord", "PARTS_DIR", "parse_part_spec", "run_id_for", "write_part", "read_parts"]

PARTS_DIR = "parts"
_FORMAT = 1
_NAME = re.compile(r"^part-(\d+)-of-(\d+)\.json$")


@dataclass(frozen=True)
class DatasetHeader:
    """The dataset-level facts a pack decides before reading any input."""

    name: str
    token_dtype: str
    tokenizer: Tokenizer
    eos_appended: bool
    media: MediaPolicy | None = None  # the media cost policy (a pack with media)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "token_dtype": self.token_dtype,
            "tokenizer": self.tokenizer.to_dict(),
            "eos_appended": self.eos_appended,
            **({"media": self.media.to_dict()} if self.media is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DatasetHeader:
        t = d["tokenizer"]
        media = MediaPolicy.from_dict(d["media"]) if d.get("media") is not None else None
        tokenizer = Tokenizer(t["name"], t["vocab_size"], t["eos_id"])
        return cls(d["name"], d["token_dtype"], tokenizer, d["eos_appended"], media)


@dataclass(frozen=True)
class PartRecord:
    """What one part stored: shard rows per unit index."""

    run_id: str
    part: int
    parts: int
    units: int
    header: DatasetHeader
    results: dict[int, list[ShardInfo]]
    skipped_media: dict[int, int] = field(default_factory=dict)  # per unit: bad items left out (--skip-bad-media)

    @property
    def path(self) -> str:
        return f"{PARTS_DIR}/{self.run_id}/part-{self.part}-of-{self.parts}.json"

    def to_json(self) -> bytes:
        doc = {
            "format": _FORMAT,
            "run_id": self.run_id,
            "part": self.part,
            "parts": self.parts,
            "units": self.units,
            "dataset": self.header.to_dict(),
            "results": [self._unit(i, rows) for i, rows in sorted(self.results.items())],
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    def _unit(self, i: int, rows: list[ShardInfo]) -> dict[str, Any]:
        skipped = self.skipped_media.get(i, 0)
        return {"unit": i, "shards": [vars(s) for s in rows], **({"skipped_media": skipped} if skipped else {})}

    @classmethod
    def from_json(cls, data: bytes, where: str) -> PartRecord:
        try:
            doc = json.loads(data)
            if doc["format"] != _FORMAT:
                raise ManifestError(f"{where}: part record format {doc['format']} is not supported")
            return cls(
                run_id=str(doc["run_id"]),
                part=int(doc["part"]),
                parts=int(doc["parts"]),
                units=int(doc["units"]),
                header=DatasetHeader.from_dict(doc["dataset"]),
                results={int(r["unit"]): [ShardInfo(**s) for s in r["shards"]] for r in doc["results"]},
                skipped_media={int(r["unit"]): _count(r.get("skipped_media", 0)) for r in doc["results"]},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"{where}: malformed part record ({exc})") from exc


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"skipped_media {value!r} is not a count")
    return value


def parse_part_spec(spec: str) -> tuple[int, int]:
    """``"3/8"`` → ``(3, 8)``; parts are numbered from 0."""
    i, sep, n = spec.partition("/")
    try:
        part, parts = int(i), int(n)
    except ValueError:
        raise UsageError(f"--part {spec!r}: expected I/N, e.g. 0/4 (parts are numbered from 0)") from None
    if not sep or parts < 1 or not 0 <= part < parts:
        raise UsageError(f"--part {spec!r}: expected I/N with 0 <= I < N")
    return part, parts


def run_id_for(units: list[Unit], header: DatasetHeader, job: Job, parts: int) -> str:
    """A digest of everything that determines the output of a fanned-out pack."""
    src = job.source
    doc = {
        "units": [[u.path, u.format, u.start, u.stop] for u in units],
        "dataset": header.to_dict(),
        "level": job.level,
        "shard_size": src.shard_size,
        "columns": [src.tokens_column, src.text_column, src.text_per_line],
        "parts": parts,
    }
    if job.stored_format != 1:  # parts of one run share one stored form (format 1 run ids stay as they were)
        doc["stored"] = [job.stored_format, job.frame_size]
    return digest_bytes(json.dumps(doc, sort_keys=True).encode()).split(":", 1)[1][:16]


def write_part(loc: Location, record: PartRecord) -> str:
    """Store a part record (after its shards); returns its path."""
    loc.write_bytes(record.path, record.to_json())
    return record.path


def read_parts(loc: Location, run_id: str | None) -> tuple[DatasetHeader, list[ShardInfo], int]:
    """Read and cross-check every part of a run; returns the header, all rows in unit order and the bad media
    items the parts left out."""
    if run_id is None:
        runs = loc.listdir(PARTS_DIR)
        if len(runs) != 1:
            found = ", ".join(runs) or "none"
            raise UsageError(f"{loc.url}: expected exactly one run under {PARTS_DIR}/ (found {found}); pass --run-id")
        run_id = runs[0]
    names = [n for n in loc.listdir(f"{PARTS_DIR}/{run_id}") if _NAME.match(n)]
    if not names:
        raise UsageError(f"{loc.url}: no part records under {PARTS_DIR}/{run_id}/")
    records = []
    for name in names:
        rel = f"{PARTS_DIR}/{run_id}/{name}"
        records.append(PartRecord.from_json(loc.read_bytes(rel), rel))
    first = records[0]
    for r in records:
        if (r.run_id, r.parts, r.units, r.header) != (first.run_id, first.parts, first.units, first.header):
            raise ManifestError(
                f"part {r.part}/{r.parts} of run {run_id} disagrees with part {first.part}/{first.parts}"
            )
    missing = sorted(set(range(first.parts)) - {r.part for r in records})
    if missing:
        raise UsageError(
            f"run {run_id}: parts {', '.join(map(str, missing))} of {first.parts} are missing; "
            "run them (ferry pack --part I/N) before --merge"
        )
    by_unit: dict[int, list[ShardInfo]] = {}
    for r in records:
        for i, rows in r.results.items():
            if i in by_unit or i % first.parts != r.part:
                raise ManifestError(f"run {run_id}: unit {i} is claimed twice or by the wrong part")
            by_unit[i] = rows
    if sorted(by_unit) != list(range(first.units)):
        raise ManifestError(f"run {run_id}: the parts cover {len(by_unit)} of {first.units} units")
    skipped = sum(n for r in records for n in r.skipped_media.values())
    return first.header, [row for i in range(first.units) for row in by_unit[i]], skipped
