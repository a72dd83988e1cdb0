"""Media items of packing inputs: what they are, checked before they enter a shard, and the documents they make.

:func:`probe` takes an item's encoded bytes and returns its kind, format, size and duration, or raises
:class:`BadMediaError` naming the input file and sample: not an image or WAV audio ferry knows, truncated,
undecodable, dimensions beyond the limits (a decompression bomb declares a huge size in a tiny file), or a
header that disagrees with its data. Images are read with Pillow: the size comes from the header, then the
image is decoded once (JPEGs at 1/8 scale, which still reads every byte) so that a truncated or corrupt file
is refused at pack time, not in a training worker. WAV audio is read with the standard ``wave`` module, MP4 and
WebM video from their container headers (:mod:`ferry.shard_tools.sources.videoprobe`: size, duration and frame
count, no frame decoded).

:class:`DocumentBuilder` turns a sample's segments (text, or media bytes) into one document: text
tokenized, each media item a placeholder span of its cost under the pack's media policy
(:mod:`ferry.shard_tools.format.policy`).
"""

from __future__ import annotations

import io
import warnings
import wave
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InputFormatError, UsageError
from ..format.media import MediaItem, media_array
from ..format.policy import MediaPolicy
from .base import DocBatch, SourceOptions
from .videoprobe import BadVideoError, is_mp4, is_webm, probe_mp4, probe_webm

__all__ = ["BadMediaError", "probe", "Segment", "DocumentBuilder", "MAX_ITEM_BYTES", "MAX_SIDE", "MAX_PIXELS"]

MAX_ITEM_BYTES = 64 << 20  # one encoded item
MAX_SIDE = 32768  # pixels per side
MAX_PIXELS = 1 << 27  # width × height (about 134 million): a larger image is a decompression bomb here
MAX_AUDIO_SECONDS = 4 * 3600
BATCH_MEDIA_BYTES = 64 << 20  # a batch of documents is handed on once its media hold this many bytes
_IMAGE_FORMATS = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp", "GIF": "gif"}


class BadMediaError(InputFormatError):
    """A media item that cannot be packed (``--skip-bad-media`` leaves such items out and counts them)."""


def probe(data: bytes, where: str) -> MediaItem:
    """The checked description of one encoded item (position and cost not set yet)."""
    if not data:
        raise BadMediaError(f"{where}: empty media item")
    if len(data) > MAX_ITEM_BYTES:
        raise BadMediaError(f"{where}: media item of {len(data)} bytes is larger than {MAX_ITEM_BYTES}")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _probe_wav(data, where)
    if is_mp4(data) or is_webm(data):
        return _probe_video(data, where)
    return _probe_image(data, where)


def _probe_video(data: bytes, where: str) -> MediaItem:
    fmt = "mp4" if is_mp4(data) else "webm"
    try:
        width, height, duration, frames = probe_mp4(data, where) if fmt == "mp4" else probe_webm(data, where)
    except BadVideoError as exc:
        raise BadMediaError(str(exc)) from None
    return MediaItem(kind="video", format=fmt, width=width, height=height, duration=duration, frames=frames, data=data)


def _probe_image(data: bytes, where: str) -> MediaItem:
    try:
        from PIL import Image
    except ImportError as exc:
        raise UsageError("packing images needs Pillow: pip install 'ferry-data[media]'") from exc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            fmt = _IMAGE_FORMATS.get(str(image.format))
            if fmt is None:
                raise BadMediaError(f"{where}: {image.format} images are not packed (JPEG, PNG, WebP, GIF)")
            width, height = image.size
            if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE) or width * height > MAX_PIXELS:
                raise BadMediaError(
                    f"{where}: image header says {width}x{height} pixels, beyond the limits ({MAX_SIDE} a side, "
                    f"{MAX_PIXELS} in all): a decompression bomb or a lying header"
                )
            if fmt == "jpeg":
                image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
            image.load()
    except BadMediaError:
        raise
    except Image.UnidentifiedImageError:
        raise BadMediaError(f"{where}: not an image Pillow can identify (unknown format or a corrupt header)") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        raise BadMediaError(f"{where}: not a readable image ({type(exc).__name__}: {exc})") from exc
    return MediaItem(kind="image", format=fmt, width=width, height=height, duration=0.0, frames=0, data=data)


def _probe_wav(data: bytes, where: str) -> MediaItem:
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            rate, frames, width, channels = w.getframerate(), w.getnframes(), w.getsampwidth(), w.getnchannels()
            got = len(w.readframes(frames)) if rate > 0 else 0
    except (wave.Error, EOFError, OSError, ValueError) as exc:
        raise BadMediaError(f"{where}: not a readable WAV file ({exc})") from exc
    duration = frames / rate if rate > 0 else -1.0
    if not 0 < duration <= MAX_AUDIO_SECONDS:
        raise BadMediaError(
            f"{where}: WAV header says {frames} frames at {rate} Hz: outside (0, {MAX_AUDIO_SECONDS}] s"
        )
    if got != frames * width * channels:
        raise BadMediaError(f"{where}: WAV header says {frames} frames, the file holds {got} bytes of them")
    return MediaItem(kind="audio", format="wav", width=0, height=0, duration=duration, frames=0, data=data)


@dataclass(frozen=True)
class Segment:
    """A piece of a sample: ``text``, or a media item's encoded ``data`` (``name`` says which in errors)."""

    text: str | None = None
    data: bytes | None = None
    name: str = ""


@dataclass
class DocumentBuilder:
    """Collects samples (lists of segments) into :class:`DocBatch` es with a media column."""

    options: SourceOptions
    path: str
    docs: list[list[Segment]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    skipped: int = 0
    nbytes: int = 0

    def add(self, segments: Sequence[Segment], row: int) -> None:
        self.docs.append(list(segments))
        self.rows.append(row)
        self.nbytes += sum(len(s.data) for s in segments if s.data is not None)

    def full(self) -> bool:
        """Enough documents, or enough media bytes, for one batch (memory stays bounded with large media)."""
        return len(self.docs) >= self.options.batch_documents or self.nbytes >= BATCH_MEDIA_BYTES

    def flush(self) -> DocBatch:
        """The documents added so far as one batch (media probed and costed, text tokenized)."""
        policy = self.options.media
        if policy is None or self.options.tokenizer is None:
            raise UsageError("packing media needs --media-policy and a --tokenizer for the text")
        texts = [s.text for doc in self.docs for s in doc if s.text is not None]
        encoded = iter(self.options.tokenizer.encode_batch(texts) if texts else [])
        tokens: list[np.ndarray] = []
        items: list[list[MediaItem]] = []
        for doc, row in zip(self.docs, self.rows, strict=True):
            parts, doc_items, length = [], [], 0
            for seg in doc:
                if seg.text is not None:
                    part = np.asarray(next(encoded), dtype=np.int64)
                else:
                    item = self._item(seg, row, policy)
                    if item is None:
                        continue
                    item = replace(item, position=length)
                    doc_items.append(item)
                    part = policy.placeholder(item.cost)
                parts.append(part)
                length += len(part)
            tokens.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
            items.append(doc_items)
        offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
        np.cumsum([len(t) for t in tokens], out=offsets[1:])
        flat = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64)
        batch = DocBatch(flat, offsets, np.asarray(self.rows, dtype=np.int64), media_array(items), self.skipped)
        self.docs, self.rows, self.skipped, self.nbytes = [], [], 0, 0
        return batch

    def _item(self, seg: Segment, row: int, policy: MediaPolicy) -> MediaItem | None:
        where = f"{self.path}: sample {row} ({seg.name})" if seg.name else f"{self.path}: sample {row}"
        try:
            item = probe(seg.data or b"", where)
        except BadMediaError:
            if not self.options.skip_bad_media:
                raise
            self.skipped += 1
            return None
        cost = policy.cost(item.kind, item.width, item.height, item.duration, item.frames)
        return replace(item, cost=cost)
