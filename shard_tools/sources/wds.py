"""WebDataset tar shards as input: image–text pairs and interleaved samples (MMC4 / OBELICS style).

A WebDataset tar holds samples as consecutive members sharing a *key* (the member's path up to the
first dot of its file name); the rest of the name is the member's extension (``jpg``, ``txt``, ``json``,
``0.png``, …). Each sample becomes one document:

- interleaved: a ``json`` member with lists ``texts`` and ``images`` of one length, each position either
  a text (``texts[i]``) or an image (``images[i]`` names the sample's member by its extension, as
  ``"0.jpg"``); the document is the segments in that order;
- pairs: the sample's media members (images, ``wav`` audio, ``mp4`` / ``webm`` video) in extension order,
  then its caption: the ``txt`` (or ``caption``) member, else the ``json`` member's ``caption`` or ``text``.

Packing a tar needs ``--media-policy`` and a ``--tokenizer``; the tar is one unit.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator

import fsspec

from ..errors import InputFormatError, UsageError
from .base import DocBatch, SourceOptions, Unit
from .mediaprobe import DocumentBuilder, Segment

__all__ = ["read_wds", "MEDIA_EXTENSIONS"]

MEDIA_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "wav", "mp4", "webm")
_TEXT_EXTENSIONS = ("txt", "caption", "text")
_MAX_MEMBER = 256 << 20  # bytes of one tar member read into memory
_Sample = dict[str, bytes]


def read_wds(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    if options.media is None:
        raise UsageError(f"{unit.path}: a WebDataset tar is packed with --media-policy (and a --tokenizer)")
    builder = DocumentBuilder(options, unit.path)
    for row, (key, sample) in enumerate(_samples(unit.path, options)):
        builder.add(_segments(unit.path, key, sample), row)
        if builder.full():
            yield builder.flush()
    if builder.docs or builder.skipped:
        yield builder.flush()


def _samples(path: str, options: SourceOptions) -> Iterator[tuple[str, _Sample]]:
    """(key, {extension: bytes}) of each sample, in tar order."""
    key: str | None = None
    sample: _Sample = {}
    try:
        with (
            fsspec.open(path, "rb", **(options.storage_options or {})) as f,
            tarfile.open(fileobj=f, mode="r|*") as tar,
        ):
            for member in tar:
                if not member.isfile():
                    continue
                k, ext = _split_name(member.name)
                if member.size > _MAX_MEMBER:
                    raise InputFormatError(
                        f"{path}: sample {k}: member {member.name} of {member.size} bytes is too large"
                    )
                if k != key and key is not None:
                    yield key, sample
                    sample = {}
                key = k
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                if ext in sample:
                    raise InputFormatError(f"{path}: sample {k} has two members with extension {ext!r}")
                sample[ext] = handle.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InputFormatError(f"{path}: not a readable tar file ({exc}); truncated or corrupt") from exc
    if key is not None:
        yield key, sample


def _split_name(name: str) -> tuple[str, str]:
    directory, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), ext.lower() if dot else ""


def _segments(path: str, key: str, sample: _Sample) -> list[Segment]:
    meta = _json(path, key, sample)
    if isinstance(meta, dict) and "texts" in meta and "images" in meta:
        return _interleaved(path, key, sample, meta)
    media = [Segment(data=sample[e], name=f"{key}.{e}") for e in sorted(sample) if _is_media(e)]
    text = next((sample[e] for e in _TEXT_EXTENSIONS if e in sample), None)
    caption = _decode(path, key, text) if text is not None else None
    if caption is None and isinstance(meta, dict):
        value = meta.get("caption", meta.get("text"))
        caption = value if isinstance(value, str) else None
    return media + ([Segment(text=caption)] if caption else [])


def _is_media(ext: str) -> bool:
    return ext.rsplit(".", 1)[-1] in MEDIA_EXTENSIONS


def _interleaved(path: str, key: str, sample: _Sample, meta: dict[str, object]) -> list[Segment]:
    texts, images = meta["texts"], meta["images"]
    if not isinstance(texts, list) or not isinstance(images, list) or len(texts) != len(images):
        raise InputFormatError(f"{path}: sample {key}: json 'texts' and 'images' must be lists of one length")
    out: list[Segment] = []
    for i, (text, image) in enumerate(zip(texts, images, strict=True)):
        if isinstance(text, str) and image is None:
            out.append(Segment(text=text))
        elif isinstance(image, str) and text is None:
            ext = image.lower()
            if ext not in sample or not _is_media(ext):
                raise InputFormatError(f"{path}: sample {key}: images[{i}] names {image!r}, not a media member")
            out.append(Segment(data=sample[ext], name=f"{key}.{ext}"))
        else:
            raise InputFormatError(f"{path}: sample {key}: position {i} must hold a text or an image name, not both")
    return out


def _json(path: str, key: str, sample: _Sample) -> object:
    if "json" not in sample:
        return None
    try:
        return json.loads(sample["json"])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFormatError(f"{path}: sample {key}: json member is not valid JSON ({exc})") from exc


def _decode(path: str, key: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFormatError(f"{path}: sample {key}: caption is not valid UTF-8 ({exc})") from exc
