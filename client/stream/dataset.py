"""``TokenDataset``: one ferry dataset read as fixed-length token samples (or whole documents).

A dataset maps *stream positions* (epoch ``e`` covers ``[e*n, (e+1)*n)``) to samples
and writes them into batch tensors. Sample ``i`` (token mode) is stream tokens
``[i*L, i*L + L + 1)``, ``n = (total_tokens - 1) // L``; in document mode sample ``i`` is
document ``i`` (with its EOS) truncated to ``L + 1`` tokens and padded. The order
within an epoch is a :mod:`ferry.client.sampling.order`; which rank reads what is the loader's business.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from ferry.shard_tools.errors import DatasetError, FerryError, StateError, UsageError
from ferry.shard_tools.format.manifest import Manifest

from .. import checks
from ..agree import agreed_manifest
from ..fetching.cache import ShardCache, default_cache_dir
from ..fetching.frames import frame_reader_for
from ..fetching.prefetcher import RECENT, Prefetcher
from ..resume.state import fingerprint
from ..sampling.order import SHUFFLE_MODES, SampleOrder, WindowOrder, make_order
from ..sampling.partition import distinct, span
from ..sampling.shards import first_samples, sample_reads, samples_of
from ..source import MODES, SampleSource
from .blocks import BlockPlans
from .mixed import MixedDataset
from .reader import ShardReader

__all__ = ["TokenDataset"]
DEFAULT_WINDOW = 8
DEFAULT_PREFETCH = 2
DEFAULT_CACHE_LIMIT = "50GiB"


class TokenDataset(SampleSource):
    """A ferry dataset read as fixed-length token samples (or documents), in a deterministic order.

    Args:
        url: dataset URL, or a list of URLs of replicas of the same dataset, nearest first.
        seq_len: tokens per sample (``input_ids`` and ``labels`` each have ``seq_len``).
        seed: shuffle seed; epoch ``e`` is permuted by ``(seed, e)``.
        shuffle: ``"global"`` | ``"window"`` | ``"none"``.
        cache_dir: node-local cache of decompressed shards (default ``$FERRY_CACHE_DIR`` or
            ``~/.cache/ferry/shards``).
        cache_limit: positive bytes or a size string (``"50GiB"``, the default, or ``$FERRY_CACHE_LIMIT``);
            least recently used shards beyond it are evicted.
        window: shards per shuffle window (``shuffle="window"``).
        mode: ``"tokens"`` (fixed windows of the token stream) or ``"document"`` (one document per sample,
            truncated/padded, with ``attention_mask``).
        pad_id: padding id in document mode, below the vocabulary size (default: the tokenizer's EOS id, else 0).
        storage_options: fsspec options, one mapping for all URLs or one per URL.
        version: read this published version instead of the current one.
        agree_version: under ``torch.distributed`` (world size > 1), without ``version``, every rank reads the
            version rank 0 read (see :mod:`ferry.client.agree`): a rank whose replicas lack it raises
            ``DatasetError`` on every rank. ``False``: each rank reads the current version it finds (for a
            dataset built on some ranks only).
        prefetch: shard prefetch depth, in batches ahead of the read position (at least; 0: no prefetch).
        prefetch_bytes: prefetch the shards of the next batches, across window and epoch boundaries, until they
            hold this many raw bytes; never more than the share of the cache not in use. ``"auto"`` (the
            default): half of this process's share of the cache when the first replica is remote, 0 (only
            ``prefetch`` batches) when it is a local filesystem.
        fetch: how shards are fetched from remote replicas (:class:`ferry.client.fetching.fetch.FetchOptions` or a
            mapping of its fields: ``part_size``, ``connections``, ``deadline_floor``, ``deadline_slack``, ...).
        verify_cache: check each cached shard's raw digest when a process first maps it.

    Every argument is checked before the manifest is read: a wrong type or range is a one-line
    ``UsageError`` naming it (``pad_id`` once the manifest gives the vocabulary size).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        seq_len: int,
        seed: int = 0,
        shuffle: str = "global",
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        mode: str = "tokens",
        pad_id: int | None = None,
        storage_options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        version: str | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        verify_cache: bool = True,
        fetch: Mapping[str, Any] | None = None,
        prefetch_bytes: int | str | None = "auto",
        agree_version: bool = True,
    ) -> None:
        from ..fetching.replicas import Replicas

        # every argument is checked before the first network round trip
        self.seq_len = checks.integer("seq_len", seq_len, 1)
        self.seed = checks.integer("seed", seed, 0, checks.SEED_LIMIT)
        self.shuffle = checks.choice("shuffle", shuffle, SHUFFLE_MODES)
        self.window = checks.integer("window", window, 1)
        self.mode = checks.choice("mode", mode, MODES)
        self.prefetch_depth = checks.integer("prefetch", prefetch, 0)
        self.prefetch_bytes: int | None = None
        if prefetch_bytes is not None and prefetch_bytes != "auto":
            self.prefetch_bytes = checks.size("prefetch_bytes", prefetch_bytes) if prefetch_bytes != 0 else 0
        verify = checks.flag("verify_cache", verify_cache)
        agree = checks.flag("agree_version", agree_version)
        pad = None if pad_id is None else checks.integer("pad_id", pad_id, 0, 2**63)
        directory = _cache_dir(cache_dir)
        limit = _cache_limit(cache_limit)
        if version is not None:
            checks.text("version", version)
        # tables once per node; a global shuffle reads frames of shards while they are fetched whole (a window
        # or an order waits for the whole fetch once it started: see ``reader``)
        share = self.shuffle == "global"
        self.replicas = Replicas(url, storage_options, fetch=fetch, cache_dir=directory, share_fills=share)
        load = self.replicas.load_manifest
        self.manifest: Manifest = agreed_manifest(load, self.replicas.names, version) if agree else load(version)
        if self.prefetch_bytes is None and self.replicas.local(0):
            self.prefetch_bytes = 0  # auto: a local first replica is fetched at disk speed, depth is enough
        self.token_dtype = np.dtype(self.manifest.token_dtype)
        self.pad_id = self._pad_id(pad)
        self.cache = ShardCache(directory, limit, self.replicas, dtype=self.manifest.token_dtype, verify=verify)
        shards = self.manifest.shards
        # every shard fits the cache: one asked for once stays in it (the prefetcher remembers RECENT shards)
        self._fits_cache = int(shards.raw_bytes.sum()) <= limit and len(shards) <= RECENT
        total_tokens = int(shards.token_offsets[-1])
        self.num_samples = self._samples_of(len(shards))
        if self.num_samples == 0:
            url, length = self.replicas.names[0], self.seq_len
            raise DatasetError(f"dataset {url} has {total_tokens} tokens: not one sample of seq_len {length} + 1")
        self._first = self._first_samples()
        self.order: SampleOrder = make_order(self.shuffle, self._first, self.seed, self.window)
        # earlier versions of a run continued on this one: [version, samples, shards, epochs] (see client.resume.state)
        self._eras: list[list[Any]] = []
        self._segments: list[tuple[int, int, int, SampleOrder]] = [(0, 0, self.num_samples, self.order)]
        self._reader: ShardReader | None = None
        self._pid = -1
        self._scan: _Scan | None = None
        self._plans = BlockPlans()  # planned reads of this process's coming batches (token mode)

    def __repr__(self) -> str:
        return (
            f"TokenDataset({self.replicas.names[0]!r}, version={self.manifest.version_id}, seq_len={self.seq_len}, "
            f"samples={self.num_samples}, shuffle={self.shuffle!r}, mode={self.mode!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_reader=None, _pid=-1, _scan=None, _plans=BlockPlans())
        return state

    def _pad_id(self, pad_id: int | None) -> int:
        """The padding id: ``pad_id`` if it is an id of the vocabulary, else the tokenizer's EOS id, else 0."""
        tokenizer = self.manifest.tokenizer
        if pad_id is None:
            return tokenizer.eos_id if tokenizer.eos_id is not None else 0
        if pad_id >= tokenizer.vocab_size:
            raise UsageError(
                f"pad_id {pad_id} is not below the vocab_size {tokenizer.vocab_size} of {self.replicas.names[0]}; "
                "pass an id of the vocabulary (or none for the EOS id)"
            )
        return pad_id

    @staticmethod
    def mix(datasets: Sequence[SampleSource], weights: Sequence[Any]) -> MixedDataset:
        """Mix datasets with exact proportions over every prefix (±1 sample per source).

        ``weights``: one per dataset, or a schedule ``[(start, weights), ...]`` of phases by global
        sample (the first at 0; for phases by step, ``start = step * global_batch_size``): within
        each phase every prefix holds each dataset in its proportion ±1, and at a boundary each
        dataset continues exactly where it stopped.
        """
        return MixedDataset(datasets, weights)

    @property
    def url(self) -> str | None:
        return self.replicas.names[0]

    @property
    def version_id(self) -> str:
        return self.manifest.version_id

    def _first_samples(self, shards: int | None = None) -> np.ndarray:
        """Shard ``s`` owns samples ``[first[s], first[s+1])``, over the first ``shards`` shards (all by default: an
        earlier version of an appended dataset has fewer); see :func:`ferry.client.sampling.shards.first_samples`."""
        table = self.manifest.shards
        return first_samples(table.token_offsets, table.documents, self.seq_len, self.mode, shards)

    def _samples_of(self, shards: int) -> int:
        """Samples per epoch of the dataset made of the first ``shards`` shards."""
        table = self.manifest.shards
        return samples_of(table.token_offsets, table.documents, self.seq_len, self.mode, shards)

    # --- epochs over versions: a run continued on a newer version (``replan=True``) -----------------------------

    def epoch_span(self, position: int) -> tuple[int, int, int]:
        start, first_epoch, n, _ = next(s for s in reversed(self._segments) if s[0] <= position)
        k = (position - start) // n
        return first_epoch + k, start + k * n, start + (k + 1) * n

    def record(self) -> dict[str, Any]:
        return {"eras": copy.deepcopy(self._eras)} if self._eras else {}

    def restored(self, saved: Any) -> TokenDataset:
        return self._with_eras(saved.eras) if saved.eras else self

    def replanned(self, saved: Any) -> tuple[TokenDataset, int]:
        """Continue a run of an older version of this dataset: its current epoch finishes over the samples it
        started with, the appended samples join from the next epoch."""
        if saved.fingerprint != fingerprint({**self.identity(), "dataset_version": saved.dataset_version}):
            raise StateError(
                f"loader state differs from {self!r} in more than the dataset version (seed {saved.seed}, "
                "shuffle, window or mode): it cannot continue exactly on this dataset"
            )
        shards = self._prefix_of(saved.dataset_version)
        old = self._with_eras([*saved.eras, [saved.dataset_version, self._samples_of(shards), shards, 1]])
        old._segments = old._segments[:-1]  # the old version's timeline: its era never ends
        position = saved.stream_position(old._segments[-1][2], strict=True)
        epoch, start, end = old.epoch_span(position)
        boundary = start if position == start else end
        first_epoch = old._segments[-1][1]
        done = epoch - first_epoch + (boundary == end)
        eras = [*saved.eras, [saved.dataset_version, self._samples_of(shards), shards, done]] if done else saved.eras
        return self._with_eras(eras), position

    def _prefix_of(self, version: str) -> int:
        """How many shards the older ``version`` had: StateError unless they are the first shards of this one."""
        try:
            old = self.replicas.load_manifest(version).shards
        except FerryError as exc:
            raise StateError(f"cannot read version {version} of {self.url} to continue its run: {exc}") from None
        new = self.manifest.shards
        n = len(old)
        if n > len(new) or old.paths != new.paths[:n]:  # shards are named by their raw digest
            raise StateError(
                f"version {self.version_id} of {self.url} does not extend version {version} (its shards are not a "
                "prefix): only a dataset grown by `ferry pack --append` can continue a run exactly"
            )
        return n

    def with_eras(self, eras: list[list[Any]]) -> TokenDataset:
        """A copy whose first epochs follow the earlier versions' ``eras`` (a state's record of them)."""
        return self._with_eras(eras)

    def _with_eras(self, eras: list[list[Any]]) -> TokenDataset:
        """A copy whose first epochs follow the earlier versions' ``eras`` (checked against this manifest)."""
        segments: list[tuple[int, int, int, SampleOrder]] = []
        start = epoch = 0
        for version, samples, shards, epochs in eras:
            if shards > len(self.manifest.shards) or self._samples_of(shards) != samples:
                raise StateError(
                    f"loader state era of version {version} ({samples} samples in {shards} shards) does not match "
                    f"the first shards of {self.url} version {self.version_id}; the state is of another dataset"
                )
            order = make_order(self.shuffle, self._first_samples(shards), self.seed, self.window)
            segments.append((start, epoch, samples, order))
            start, epoch = start + samples * epochs, epoch + epochs
        out = copy.copy(self)  # with a reader, scan and block plans of its own (__getstate__)
        out._eras = [list(e) for e in eras]
        out._segments = [*segments, (start, epoch, self.num_samples, self.order)]
        return out

    def identity(self) -> dict[str, Any]:
        ident: dict[str, Any] = {
            "dataset_version": self.manifest.version_id,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "mode": self.mode,
            "shuffle": self.shuffle,
        }
        if self.shuffle == "window":
            ident["window"] = self.window
        return ident

    @property
    def reader(self) -> ShardReader:
        """This process's reader (re-created after a fork: mapped leases are per process)."""
        if self._reader is None or self._pid != _FORKS.generation:
            # every process on the node that shares the cache keeps at most its share of it mapped
            info = get_worker_info()
            share = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) * (info.num_workers if info else 1)
            budget = self.cache.limit // share
            # pre-fault mapped shards when they will be read through: windows read each shard whole, and a
            # dataset that stays mapped is read whole over an epoch; a global shuffle of a big one is not
            populate = self.shuffle != "global" or int(self.manifest.shards.raw_bytes.sum()) <= budget
            # format-3 shards: read by frames when whole shards are not wanted (the same test) or not cached yet
            frames = frame_reader_for(self.manifest, self.replicas, budget)
            # frames of a local replica are read by the gathering thread: with a second core this process may count
            # on, one whole fetch starts meanwhile (one at most: a container's CPU quota is not in its affinity mask)
            spare = _cores() // share > 1
            at_once = 1 if spare and self.replicas.local(0) else 0
            prefetcher = Prefetcher(self.cache, at_once=at_once) if self.prefetch_depth > 0 else None
            # once a shard's whole fetch started, batches wait for it rather than read its frames (each sample
            # decompresses a whole frame again): in windows and in order, where the next batches read the same
            # shards, and from a local first replica, where the wait is only the decompression
            wait = self.shuffle != "global" or self.replicas.local(0)
            self._reader = ShardReader(
                self.manifest, self.cache, max_bytes=budget, populate=populate, frames=frames, whole_shards=populate,
                prefetcher=prefetcher, wait_for_started=wait,
                max_open=2 * self.window if self.shuffle == "window" else 64,
                head_tokens=self.seq_len + 1 if self.mode == "tokens" else 0,
            )  # fmt: skip
            self._pid = _FORKS.generation
            self._scan = None
        return self._reader

    def sample_ids(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at stream ``positions`` (each epoch its own permutation)."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size == 0:
            return pos.copy()
        if len(self._segments) > 1:
            return self._era_sample_ids(pos)
        n = self.num_samples
        lo, hi = (p // n for p in span(pos))
        if lo == hi:  # the usual case: the whole batch in one epoch
            return self.order.sample_ids(lo, pos - lo * n)
        epoch, within = np.divmod(pos, n)
        out = np.empty_like(pos)
        for e in distinct(epoch):  # positions in several epochs: only the epochs present
            sel = epoch == e
            out[sel] = self.order.sample_ids(e, within[sel])
        return out

    def _era_sample_ids(self, pos: np.ndarray) -> np.ndarray:
        """Sample ids of a run over several versions: each segment's epochs have its own length and order."""
        starts = np.asarray([s[0] for s in self._segments], dtype=np.int64)
        seg = np.searchsorted(starts, pos, side="right") - 1
        out = np.empty_like(pos)
        for k in distinct(seg):
            start, first_epoch, n, order = self._segments[k]
            sel = seg == k
            epoch, within = np.divmod(pos[sel] - start, n)
            ids = np.empty_like(within)
            for e in distinct(epoch):
                part = epoch == e
                ids[part] = order.sample_ids(first_epoch + e, within[part])
            out[sel] = ids
        return out

    def fill(self, positions: np.ndarray, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        ids = self.sample_ids(positions)
        if self.mode == "tokens":
            self.reader.gather_windows(ids * self.seq_len, self.seq_len, out["windows"], rows)
        else:
            self.reader.gather_documents(
                ids, self.seq_len, self.pad_id, out["input_ids"], out["labels"], out["attention_mask"], rows
            )

    def planned_payload(
        self, key: object, i: int, positions_of: Callable[[int], np.ndarray], *, boundaries: bool = False
    ) -> dict[str, Any]:
        if self.mode != "tokens" or boundaries:
            return self.payload(positions_of(i), boundaries=boundaries)
        reads = self._plans.reads(key, self._segments, i, positions_of, self._reads_of)
        windows = np.empty((len(reads.shards), self.seq_len + 1), dtype=self.token_dtype)
        self.reader.gather_reads(reads, windows)
        return {"windows": windows}

    def _reads_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the token-mode samples at stream ``positions`` are read (see :func:`sample_reads`)."""
        starts = self.sample_ids(positions) * self.seq_len
        return sample_reads(starts, self.manifest.shards.token_offsets, self.seq_len + 1)

    def boundaries(self, positions: np.ndarray) -> list[list[int]]:
        starts = self.sample_ids(positions) * self.seq_len
        return [self.reader.boundaries(a, self.seq_len) for a in starts.tolist()]

    def shards_of(self, positions: np.ndarray, *, to_fetch: bool = False) -> list[int]:
        """Indices of the shards the samples at ``positions`` touch. ``to_fetch``: those to fetch whole, without
        the shards only a sample's continuation touches whose head is read without them (by frames, or kept)."""
        ids = self.sample_ids(positions)
        reader = self.reader
        if self.mode == "document":
            return sorted(set(reader.shard_of_document(ids).tolist()))
        starts = ids * self.seq_len
        ends = reader.shard_of_token(np.concatenate([starts, starts + self.seq_len]))
        first, last = ends[: len(starts)].tolist(), ends[len(starts) :].tolist()
        touched = set(first)
        for a, b in zip(first, last, strict=True):
            if b > a:  # runs on into the next shard(s)
                touched.update(t for t in range(a + 1, b + 1) if not (to_fetch and reader.head_without_shard(t)))
        return sorted(touched)

    def prefetch(self, positions: np.ndarray) -> None:
        if self.prefetch_depth == 0 or len(positions) == 0 or self._all_asked():
            return
        reader, prefetcher = self.reader, self._prefetcher
        wanted = self.shards_of(positions, to_fetch=True)
        todo = [s for s in wanted if not prefetcher.asked(s) and not reader.frames_only(s)]
        if not todo:
            return
        if prefetcher.asked_count > RECENT:
            prefetcher.forget()  # forget old requests: their shards may have been evicted since
        self._submit(todo)

    @property
    def _prefetcher(self) -> Prefetcher:
        """This process's background fetches (with a prefetch depth above 0)."""
        prefetcher = self.reader.prefetcher
        assert prefetcher is not None
        return prefetcher

    def _all_asked(self) -> bool:
        """Whether there is nothing to prefetch: every shard is mapped here (held in the cache), or went through
        the cache in this process and none gets evicted."""
        count = len(self.manifest.shards)
        if self.reader.mapped_count >= count:
            return True
        return self._fits_cache and self._prefetcher.asked_count >= count

    def prefetch_ahead(self, plan: object, i: int, positions_of: Callable[[int], np.ndarray]) -> None:
        """Prefetch, in the order they are first read, the shards of this process's batches after its ``i``-th
        (``positions_of(j)``: the stream positions of its ``j``-th batch, past this epoch too) until they
        hold ``prefetch_bytes`` bytes or the part of the cache not in use, and at least ``prefetch`` batches.

        The scan resumes where it stopped (at most 16 batches per call), so its cost per batch is
        constant; ``plan`` names the sequence, a new one starts a new scan."""
        if self.prefetch_depth == 0 or self._all_asked():
            return
        reader = self.reader
        scan = self._scan
        if scan is None or scan.plan != plan:
            scan = self._scan = _Scan(plan, i)
        scan.advance(i)
        budget = max(0, reader.max_bytes - reader.mapped_bytes)  # what this process may map, less what it has mapped
        horizon = min(budget // 2 if self.prefetch_bytes is None else self.prefetch_bytes, budget)
        if horizon and self.shuffle in ("window", "none") and len(self._segments) == 1:
            # the order names the coming shards window by window: no need to walk the batches
            want = self._coming_shards(int(positions_of(i).min()), horizon, reader.mapped_shards())
            todo = [s for s in want if s not in scan.sent]
            scan.sent = set(want)  # one that leaves and comes back (next epoch) is sent again
            if todo:
                self._submit(todo)
            return
        sizes = self.manifest.shards.raw_bytes
        todo = []
        for _ in range(_SCAN_STEP):
            if scan.cursor - i > _SCAN_LIMIT or len(scan.ahead) >= len(sizes):
                break  # as far as it may look, or every shard is ahead already (a dataset below the horizon)
            if scan.cursor - i >= self.prefetch_depth and scan.bytes >= horizon:
                break
            scan.cursor += 1
            for s in self.shards_of(positions_of(scan.cursor), to_fetch=True):
                if s not in scan.ahead:
                    scan.ahead[s] = (scan.cursor, int(sizes[s]))
                    scan.bytes += int(sizes[s])
                    todo.append(s)
        if todo:
            self._submit(todo)

    def _coming_shards(self, position: int, horizon: int, mapped: set[int]) -> list[int]:
        """Shards not in ``mapped`` that the stream reads from ``position`` on, in order, until they hold
        ``horizon`` bytes: the rest of the current window (``none``: of the dataset), then the next ones,
        into the next epochs; each window's shards, then their successors, where samples that cross an end continue
        (unless their heads are read without them)."""
        sizes = self.manifest.shards.raw_bytes
        count = len(sizes)
        reader = self.reader
        out: dict[int, None] = {}
        total = 0
        epoch, within = divmod(position, self.num_samples)
        for e in range(epoch, epoch + 2):
            for group in self._groups(e, within if e == epoch else 0):
                # the window's own shards first (its first batch reads them all), then the successors that only
                # the sample crossing a shard's end reads, and only where their head is not read without them
                nexts = [s + 1 for s in group if s + 1 < count and not reader.head_without_shard(s + 1)]
                for t in [*group, *nexts]:
                    if t not in out and t not in mapped:
                        out[t] = None
                        total += int(sizes[t])
                if total >= horizon or len(out) + len(mapped) >= count:
                    return list(out)
        return list(out)

    def _groups(self, epoch: int, within: int) -> Iterator[list[int]]:
        """The shards of epoch ``epoch`` from position ``within`` on, a window (``none``: a shard) at a time."""
        if self.shuffle == "none":
            first = self._first
            s = max(0, int(np.searchsorted(first, within, side="right")) - 1)
            for t in range(s, len(first) - 1):
                yield [t]
            return
        assert isinstance(self.order, WindowOrder)
        yield from self.order.windows_from(epoch, within)

    def _submit(self, shards: list[int]) -> None:
        """Ask the prefetcher for ``shards`` whole; a format-3 shard whose cold read starts with frames once the
        samples at hand are read, so that its fetch does not compete with them."""
        reader, prefetcher = self.reader, self._prefetcher
        for s in shards:
            if reader.mapped(s) or reader.frames_only(s):
                continue  # in the cache already (mapped here), or never fetched whole
            # a shard asked for once is in the cache for good when the dataset fits it; else it may have been evicted
            again = not self._fits_cache
            prefetcher.request(s, reader.info(s), after_gather=reader.read_by_frames_first(s), again=again)

    def settle(self) -> None:
        """Let this process's background fetches end (see :meth:`ferry.client.fetching.prefetcher.Prefetcher.settle`;
        its threads are made again if the process reads on)."""
        if self._reader is not None and self._pid == _FORKS.generation and self._reader.prefetcher is not None:
            self._reader.prefetcher.settle()

    def raise_deferred(self) -> None:
        self.cache.raise_deferred()

    def close(self) -> None:
        self._scan = None
        self.settle()
        if self._reader is not None and self._pid == _FORKS.generation:
            self._reader.close()
        self._reader = None
        self.replicas.close()


class _Scan:
    """Where the prefetch scan of one batch sequence stands: shards first read after the current batch."""

    def __init__(self, plan: object, i: int) -> None:
        self.plan, self.cursor = plan, i
        self.ahead: dict[int, tuple[int, int]] = {}  # shard -> (batch that first reads it, raw bytes), in order
        self.bytes = 0
        self.sent: set[int] = set()  # by the window path: the coming shards already submitted

    def advance(self, i: int) -> None:
        """Batch ``i`` is being read: its shards (and earlier ones) leave the horizon."""
        while self.ahead:
            s, (first, size) = next(iter(self.ahead.items()))
            if first > i:
                break
            del self.ahead[s]
            self.bytes -= size
        self.cursor = max(self.cursor, i)


_SCAN_STEP = 16  # batches scanned ahead per batch built, at most (the scan outruns the loop 16:1)
_SCAN_LIMIT = 1 << 20  # batches ahead, at most


class _ForkCounter:
    """Counts forks in this process's ancestry (cheaper than ``os.getpid()`` on every batch)."""

    generation = 0

    @classmethod
    def bump(cls) -> None:
        cls.generation += 1


_FORKS = _ForkCounter
os.register_at_fork(after_in_child=_ForkCounter.bump)


def _cache_dir(cache_dir: Any) -> str:
    if cache_dir is not None:
        return checks.path("cache_dir", cache_dir)
    return checks.path("$FERRY_CACHE_DIR", default_cache_dir())


def _cache_limit(cache_limit: Any) -> int:
    if cache_limit is not None:
        return checks.size("cache_limit", cache_limit)
    env = os.environ.get("FERRY_CACHE_LIMIT")
    return checks.size("$FERRY_CACHE_LIMIT", env) if env else checks.size("cache_limit", DEFAULT_CACHE_LIMIT)


def _cores() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (Linux), else the machine's count."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
