"""Runner: Megatron-Energon ``get_train_dataset`` + ``get_loader`` over WebDataset tars prepared by ``energon
prepare`` (``CaptioningSample``: ``image`` from ``.jpg``, ``caption`` from ``.txt``), local or from S3.

The task encoder sets ``decoder = None``, so Energon hands over each tar member's raw bytes (no decode of its
own) and ``encode_sample`` decodes the JPEG with :func:`_medialoop.rgb` in the DataLoader workers, as every other
tool; Energon's loader turns the batch's numpy arrays into tensors (``torch.as_tensor``, no copy).

Remote (``endpoint``): an ``msc://`` path through a multi-storage-client profile for the S3-compatible endpoint,
with MSC's cache in ``cache_dir``. Energon reads tar members by byte ranges, which MSC serves from cache lines
(its default 64 MiB: a whole shard here), each fetched whole on first use. ``check_source_version`` is off: with
MSC's default every ranged read first sends a HEAD for the object's ETag, a round trip per member. Peers' venv."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import multistorageclient.providers.s3  # noqa: F401  # MSC's S3 provider (boto3) before the clock, as every runner
from _medialoop import caption_ids, main, rgb
from megatron.energon import (
    CaptioningSample,
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
    stateless,
)

PROFILE = "bench-s3"  # the multi-storage-client profile of the remote runs


class RawJpeg(DefaultTaskEncoder[CaptioningSample, dict[str, Any], dict[str, Any], dict[str, Any]]):
    """No decoder: ``image`` and ``caption`` arrive as the tar members' bytes; the JPEG is decoded here, in the
    worker, by the shared :func:`rgb`."""

    decoder = None

    @stateless
    def encode_sample(self, sample: CaptioningSample) -> dict[str, Any]:
        caption: Any = sample.caption
        text = caption.decode() if isinstance(caption, bytes) else str(caption)
        return {"image": rgb(sample.image), "ids": caption_ids(text)}

    @stateless
    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {"images": [s["image"] for s in samples], "ids": [s["ids"] for s in samples]}


def _msc_path(a: dict[str, Any]) -> str:
    """``s3://BUCKET/PREFIX`` as ``msc://PROFILE/PREFIX``, the profile written to a config file that ``MSC_CONFIG``
    names (read by the workers too): the bucket at the custom endpoint, MSC's cache in ``cache_dir``."""
    bucket, _, prefix = a["data"].removeprefix("s3://").partition("/")
    cache = Path(a["cache_dir"])
    cache.mkdir(parents=True, exist_ok=True)
    config = {
        "profiles": {
            PROFILE: {
                "storage_provider": {
                    "type": "s3",
                    "options": {"base_path": bucket, "endpoint_url": a["endpoint"], "region_name": "us-east-1"},
                },
                "credentials_provider": {
                    "type": "S3Credentials",
                    "options": {"access_key": "testing", "secret_key": "testing"},
                },
                "caching_enabled": True,
            }
        },
        "cache": {"size": "20G", "location": str(cache / "msc"), "check_source_version": False},
    }
    (cache / "msc.json").write_text(json.dumps(config))
    os.environ["MSC_CONFIG"] = str(cache / "msc.json")
    return f"msc://{PROFILE}/{prefix}"


def _build(a: dict[str, Any]) -> Any:
    path = _msc_path(a) if a.get("endpoint") else a["data"]
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=a["workers"], seed_offset=a["seed"])
    # Energon's shuffle: the shards cut into slices of at most max_samples_per_sequence samples, read in a seeded
    # order, through a seeded shuffle buffer of shuffle_buffer_size samples
    ds = get_train_dataset(
        path,
        worker_config=worker_config,
        batch_size=a["batch_size"],
        batch_drop_last=True,
        shuffle_buffer_size=a["shuffle_buffer"],
        max_samples_per_sequence=a["samples_per_sequence"],
        task_encoder=RawJpeg(),
    )
    return get_loader(ds)


if __name__ == "__main__":
    main(_build, lambda b: len(b["images"]))
