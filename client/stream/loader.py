"""``TokenLoader``: batches for one rank, in a fixed global order, with an exactly resumable state.

The loader walks the dataset's endless stream of positions (see :mod:`ferry.client.sampling.partition`).
One ``iter()`` runs to the end of the current epoch (its last global batch may reach
into the next epoch so that nothing is dropped); the next ``iter()`` continues there.
With workers, each builds the batches ``k ≡ worker (mod num_workers)`` and the loader
puts them back in order of ``k``; a ferry error in a worker reaches the caller unchanged,
after the batches before it. The state counts batches *delivered* to the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.util  # registers its exit hook now, so that _at_exit (registered below) runs before it
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Generator, Iterator, Mapping
from multiprocessing import connection
from typing import Any, NoReturn

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils import signal_handling as _torch_signals

from ferry.shard_tools.errors import FerryError, UsageError
from ferry.shard_tools.orphans import exit_with_parent

from .. import checks
from ..pipes import ITEM_BYTES, widen_result_pipe
from ..resume.replan import resume
from ..resume.state import make_state, parse_state
from ..sampling.partition import batches_until, global_batch_size, rank_positions, worker_batches
from ..service.jobs import report_jobs
from ..slots import Slots
from ..source import SampleSource, to_batch
from ..stats import COUNTERS, merge, render_prometheus, subtract, summarise
from .ahead import WhenIdle

__all__ = ["TokenLoader", "default_rank_world", "rank_world"]

Batch = dict[str, torch.Tensor]
_GROUP_MAX = 8  # batches per DataLoader item from a worker, at most (items hold ITEM_BYTES of tokens)
# the workers' shared slots stay mapped as long as the workers: beyond this many bytes in all, the pipe instead
SLOTS_MAX_BYTES = 256 << 20
_CLOSE_WAIT_S = 2.0  # closing waits this long for the helper thread to take a worker's item in progress
_STOP_WAIT_S = 2.0  # then the workers have this long to end by themselves before they are terminated
SHAPE_LIMIT = 2**24  # batch_size and world_size: stream positions then stay far inside int64
_STALL_WINDOW_S = 30.0  # stall share is judged over this much wall time
_IDLE_S = 0.001  # the next batch is built (or received from a worker) ahead once the loop has run its step this long
_log = logging.getLogger("ferry.loader")


def default_rank_world() -> tuple[int, int]:
    """``torch.distributed`` rank/world size if initialised, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"${name} must be an integer, got {checks.show(text)}; fix the environment") from None


class _Plan:
    """What one ``iter()`` reads: batches ``k < count`` of rank ``rank`` from stream position ``start``."""

    def __init__(self, start: int, count: int, batch_size: int, world_size: int, rank: int, boundaries: bool) -> None:
        self.start, self.count = start, count
        self.batch_size, self.world_size, self.rank = batch_size, world_size, rank
        self.boundaries = boundaries

    def positions(self, k: int) -> np.ndarray:
        return rank_positions(self.start, k, self.batch_size, self.world_size, self.rank)

    def build(self, ds: SampleSource, k: int, ahead: range, mine: range) -> dict[str, Any]:
        """The payload of batch ``k`` (compact numpy arrays; :func:`to_batch` makes the tensors).

        ``mine``: this process's batches; a dataset that can prefetch by a horizon in bytes walks them on
        (past this plan's end too: the next epoch is known), otherwise the ``ahead`` batches are prefetched.
        The payload is asked for by the batch's place in ``mine``, under a key that fixes the positions of
        every batch of it, so that a dataset may plan the reads of the coming ones together."""
        first, stride = mine.start, mine.step

        def positions_of(j: int) -> np.ndarray:
            return self.positions(first + j * stride)

        i = (k - first) // stride
        # the sequence of this process's batches: every batch's positions follow from it (see rank_positions)
        key = (self.start, self.batch_size, self.world_size, self.rank, first, stride)
        horizon = getattr(ds, "prefetch_ahead", None)
        if horizon is not None:
            horizon(key, i, positions_of)
        else:
            for j in ahead:  # shards for later batches of this process start downloading now
                if j < self.count:
                    ds.prefetch(self.positions(j))
        return ds.planned_payload(key, i, positions_of, boundaries=self.boundaries)

    @staticmethod
    def ahead(mine: range, i: int, depth: int) -> range:
        """Batches (of ``mine``) to prefetch when building ``mine[i]``: all ``depth`` next ones the
        first time, then only the one that newly enters the horizon."""
        if depth == 0:
            return range(0)
        return mine[i + 1 : i + 1 + depth] if i == 0 else mine[i + depth : i + depth + 1]


class _WorkerTraceback(Exception):
    """The traceback of an error in a DataLoader worker, chained as the ``__cause__`` of the re-raised error."""


class _Failure:
    """A ferry error raised while a worker built batch ``k``, sent to the main process as data.

    DataLoader re-raises a worker's exception as ``type(traceback_text)``: a different message,
    and a RuntimeError for classes whose constructor takes more (``ShardError(shard, message)``).
    Sent as an item, the error is unpickled whole (type, message, ``.shard``) and raised by the
    main process when it reaches batch ``k``, after every earlier batch, as without workers.
    """

    def __init__(self, error: FerryError, worker: int) -> None:
        self.error = error
        self.where = f"in DataLoader worker {worker}:\n" + "".join(traceback.format_exception(error))

    @staticmethod
    def of(error: FerryError, worker: int) -> _Failure | None:
        """The failure to send, or None when the error does not survive pickling (then DataLoader reports it)."""
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:  # noqa: BLE001 — any pickling failure means: let DataLoader report it
            return None
        return _Failure(error, worker)

    def reraise(self) -> NoReturn:
        raise self.error from _WorkerTraceback(self.where)


_Item = list[tuple[int, dict[str, Any] | _Failure]]


class _WorkerStream(IterableDataset[tuple[_Item, dict[str, Any]]]):
    """Runs in a DataLoader worker: yields lists of ``(k, payload)`` for this worker's share of the plan,
    each with the growth of the worker's :data:`~ferry.client.stats.COUNTERS` since the previous one.

    Payloads are numpy arrays in the token dtype (4x smaller than int64 for uint16 ids). Their token windows go
    into shared-memory slots made once for the workers (:mod:`ferry.client.slots`), and the rest of the item is
    pickled through the worker's pipe (all of it where no slot is free or the workers were not forked).
    ``group`` batches travel together, which spreads DataLoader's fixed cost per item; the first goes
    alone, so a cold start waits for one batch, not for ``group`` (whose later batches may wait on
    whole shards the prefetch brings). A ferry
    error ends the worker's share with a :class:`_Failure` in place of batch ``k``; a node-cache failure
    that only the background fetches of its last batches met comes after them, as batch ``plan.count``.
    """

    def __init__(
        self, ds: SampleSource, plan: _Plan, num_workers: int, group: int, span: Any = None, slots: Slots | None = None
    ) -> None:
        self.ds, self.plan, self.num_workers, self.group = ds, plan, num_workers, group
        self.span = span  # shared memory [start, count] of the plan each iteration reads (kept workers), or None
        self.slots = slots  # where the items' token windows go instead of the pipe (see ferry.client.slots), or None

    def _current(self) -> _Plan:
        """The plan of this iteration: the one given, at the start and count the loader set for it last."""
        if self.span is None:
            return self.plan
        p = self.plan
        return _Plan(int(self.span[0]), int(self.span[1]), p.batch_size, p.world_size, p.rank, p.boundaries)

    def __iter__(self) -> Iterator[tuple[_Item, dict[str, Any]]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        self.plan = self._current()
        mine = worker_batches(self.plan.count, self.num_workers, worker)
        depth = self.ds.prefetch_depth
        item: _Item = []
        seen = COUNTERS.changes
        sent = COUNTERS.snapshot()  # a forked worker starts with its parent's counters: send only growth
        for i, k in enumerate(mine):
            try:
                item.append((k, self.plan.build(self.ds, k, _Plan.ahead(mine, i, depth), mine)))
            except FerryError as exc:
                failure = _Failure.of(exc, worker)
                if failure is None:
                    raise
                self.ds.settle()  # the fetches in flight end (and remove their temp files) before the worker is stopped
                yield [*item, (k, failure)], subtract(COUNTERS.snapshot(), sent)
                return
            if len(item) == self.group or i == 0 or i == len(mine) - 1:  # the first batch goes alone: the loop waits
                if self.slots is not None:
                    item = self.slots.put(worker, item)
                if COUNTERS.changes == seen:
                    yield item, {}  # nothing fetched or counted since the last item: no copy, nothing to add
                    item = []
                    continue
                seen = COUNTERS.changes
                now = COUNTERS.snapshot()
                yield item, subtract(now, sent)
                sent, item = now, []
        self.ds.settle()  # the background fetches started for the last batches end, and are counted below
        end: _Item = []
        try:
            self.ds.raise_deferred()  # a full disk only the last background fetches met: after the last batch
        except FerryError as exc:
            failure = _Failure.of(exc, worker)
            if failure is None:
                raise
            end = [(self.plan.count, failure)]
        if end or COUNTERS.changes != seen:
            yield end, subtract(COUNTERS.snapshot(), sent)  # what the worker fetched after its last batch


class TokenLoader:
    """Deterministic, elastic, exactly resumable batches of a :class:`~ferry.client.stream.dataset.TokenDataset`
    (or mixture).

    Args:
        dataset: a ``TokenDataset`` or ``MixedDataset``.
        batch_size: samples per batch on this rank.
        num_workers: DataLoader worker processes (0: build batches in this process).
        rank, world_size: default from ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else 0/1.
        pin_memory: pin batches (only where CUDA is available; ignored otherwise).
        return_doc_boundaries: add ``cu_seqlens`` (int32, over the flattened batch) and ``position_ids``.
        shared_labels: ``input_ids`` and ``labels`` are two overlapping views of one ``[batch_size, seq_len + 1]``
            int64 tensor, widened once, rather than two contiguous tensors (token mode; see
            :func:`~ferry.client.source.to_batch`): a step that changes its labels in place changes its inputs.
        prefetch_factor: batches each worker builds ahead (DataLoader's own prefetching).
        stall_warning: log a warning when the loop waited on data more than this share of the last 30 s.
        service: URL of the cluster's ferry daemon to register this loader's read plan with (default
            ``$FERRY_SERVICE_URL``; ``False``: never), so it can show the job and stage its shards ahead.
            Best-effort, from a background thread: the batches and their timing do not depend on it.

    ``stats()`` says what it did (see :mod:`ferry.client.stats`); ``prometheus()`` is the same as Prometheus text.
    """

    def __init__(
        self,
        dataset: SampleSource,
        batch_size: int,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        pin_memory: bool = False,
        return_doc_boundaries: bool = False,
        *,
        prefetch_factor: int = 2,
        stall_warning: float = 0.1,
        service: str | bool | None = None,
        shared_labels: bool = False,
    ) -> None:
        if not isinstance(dataset, SampleSource):
            raise UsageError(f"dataset must be a TokenDataset or MixedDataset, got {checks.show(dataset)}")
        self._configured = dataset
        self.dataset = dataset  # the configured one, with the history of a loaded state
        self._skips: list[dict[str, int]] = []
        self.batch_size = checks.integer("batch_size", batch_size, 1, SHAPE_LIMIT)
        self.num_workers = checks.integer("num_workers", num_workers, 0)
        self.prefetch_factor = checks.integer("prefetch_factor", prefetch_factor, 1)
        self.pin_memory = checks.flag("pin_memory", pin_memory) and torch.cuda.is_available()
        self.return_doc_boundaries = checks.flag("return_doc_boundaries", return_doc_boundaries)
        self.shared_labels = checks.flag("shared_labels", shared_labels)
        self.rank, self.world_size = rank_world(rank, world_size)
        if self.return_doc_boundaries and dataset.mode != "tokens":
            raise UsageError("return_doc_boundaries needs mode='tokens' (document mode gives attention_mask)")
        if self.shared_labels and dataset.mode != "tokens":
            raise UsageError("shared_labels needs mode='tokens' (document mode pads its labels apart from its inputs)")
        self._position = 0  # stream position of the next global batch not yet delivered
        if isinstance(stall_warning, bool) or not isinstance(stall_warning, (int, float)) or not 0 < stall_warning <= 1:
            raise UsageError(f"stall_warning must be a share in (0, 1], got {checks.show(stall_warning)}")
        self._watch = _StallWatch(float(stall_warning))
        self._counters_at_start = COUNTERS.snapshot()
        self._job = report_jobs(self, service)  # the daemon hears of this loader (its thread holds it weakly)
        self._kept: _KeptWorkers | None = None  # the workers of the last epoch read to its end
        # held while the dataset is read: by whoever builds a batch without workers (the loop, or the thread
        # that builds the next one during its step), and by the methods below that read it between batches
        self._lock = threading.RLock()

    @property
    def global_batch_size(self) -> int:
        return global_batch_size(self.batch_size, self.world_size)

    @property
    def position(self) -> int:
        """Global samples delivered so far, over all epochs (the stream position of the next batch)."""
        return self._position

    @property
    def epoch(self) -> int:
        return self.dataset.epoch_span(self._position)[0]

    def _epoch_end(self) -> int:
        return self.dataset.epoch_span(self._position)[2]

    def __len__(self) -> int:
        """Batches the next ``iter()`` delivers (to the end of the current epoch)."""
        return batches_until(self._position, self._epoch_end(), self.batch_size, self.world_size)

    def _plan(self) -> _Plan:
        return _Plan(self._position, len(self), self.batch_size, self.world_size, self.rank, self.return_doc_boundaries)

    def __iter__(self) -> Iterator[Batch]:
        batches = self._iterate()
        _LIVE.add(batches)  # closed at interpreter exit if the caller left it open
        return batches

    def _iterate(self) -> Generator[Batch, None, None]:
        plan = self._plan()
        g = self.global_batch_size
        source: Generator[Batch, None, None] | WhenIdle[Batch]
        source = WhenIdle(self._local(plan), _IDLE_S, self._lock) if self.num_workers == 0 else self._workers(plan)
        width = self._window_bytes()
        watch = self._watch
        try:
            mark = time.perf_counter()
            for k in range(plan.count + 1):
                batch = next(source, None)
                if batch is not None:
                    # count the batch as consumed the moment it is handed over, not when it was built
                    self._position = plan.start + (k + 1) * g
                    watch.delivered(next(iter(batch.values())).shape[0] * width)  # not len(): torch's is Python
                # the wait ends as late as it can: what runs between here and the caller is not counted
                now = time.perf_counter()
                watch.step(now - mark, waited=now - watch.resumed if k else now - mark)
                mark = now
                if batch is None:
                    break
                yield batch
                watch.resumed = time.perf_counter()
        finally:
            if isinstance(source, WhenIdle):
                source.close(_CLOSE_WAIT_S)  # the batch being built ahead (if any) ends first
            else:
                source.close()  # an abandoned iterator stops its worker processes now

    def stats(self) -> dict[str, Any]:
        """What this loader did so far: stall (time ``next()`` waited) and its share of the wall time, bytes
        delivered and downloaded (their ratio), cache hits, and per replica requests, bytes, latency
        percentiles, hedged and failed requests. Counters of DataLoader workers are included (each sends
        its growth with its batches); ``raw`` holds the counters themselves."""
        raw = self._raw_stats()
        return {**summarise(raw), "first_batch_s": self._watch.first_batch_s, "raw": raw}

    def prometheus(self, prefix: str = "ferry_loader") -> str:
        """:meth:`stats` in the Prometheus text format (for a training script's /metrics)."""
        return render_prometheus(self._raw_stats(), prefix)

    def _raw_stats(self) -> dict[str, Any]:
        grown = subtract(COUNTERS.snapshot(), self._counters_at_start)
        # replicas only other loaders of this process talked to grew by nothing: leave them out
        grown["replicas"] = {u: r for u, r in grown.get("replicas", {}).items() if r["requests"] or r["hedged"]}
        return merge(grown, {"loop": self._watch.counters()})

    def _local(self, plan: _Plan) -> Generator[Batch, None, None]:
        depth = self.dataset.prefetch_depth
        mine = range(plan.count)
        for k in mine:
            try:
                payload = plan.build(self.dataset, k, _Plan.ahead(mine, k, depth), mine)
                batch = to_batch(payload, shared_labels=self.shared_labels)
            except FerryError:
                self.dataset.settle()  # the fetches in flight end (and remove their temp files) first
                raise
            yield _pin(batch, self.shared_labels) if self.pin_memory else batch
        self.dataset.settle()  # the last batches' background fetches end (and are counted), as in a worker
        self.dataset.raise_deferred()  # a full disk only they met is raised after the last batch

    def _workers(self, plan: _Plan) -> Generator[Batch, None, None]:
        """Batches from DataLoader workers: those of the last epoch when it was read to its end (they keep their
        mapped shards, checked cache files and threads), else new ones. Workers of an epoch left early stop."""
        key = (id(self.dataset), self.num_workers, self.prefetch_factor, plan.batch_size, plan.world_size, plan.rank,
               plan.boundaries)  # fmt: skip
        kept, self._kept = self._kept, None
        if kept is not None and kept.key != key:
            kept.stop()
            kept = None
        if kept is None:
            self.dataset.close()  # no threads or mapped shards in the parent when the workers fork
            try:
                span = multiprocessing.Array("q", 2, lock=False)  # the plan of each epoch, read by the kept workers
            except OSError:
                span = None  # no shared memory for it (e.g. a full disk): new workers every epoch
            slots = self._slots()
            stream = _WorkerStream(self.dataset, plan, self.num_workers, self._group(), span, slots)
            loader = DataLoader(
                stream,
                batch_size=None,
                collate_fn=_as_is,
                num_workers=self.num_workers,
                prefetch_factor=self.prefetch_factor,
                worker_init_fn=_worker_init,
                persistent_workers=span is not None,
            )
            kept = _KeptWorkers(key, loader, span, slots)
        if kept.span is not None:
            kept.span[0], kept.span[1] = plan.start, plan.count  # before iter(): the workers read it when resumed
        items = iter(kept.loader)
        widen_result_pipe(items)
        source = WhenIdle(self._received(items, kept.slots), _IDLE_S, self._lock)
        read_to_end = False
        try:
            yield from source  # received by the helper thread while the loop ran its step, or by the loop
            read_to_end = True
        finally:
            ended = source.close(_CLOSE_WAIT_S)  # stopped, or still waiting on a worker
            if read_to_end and ended and kept.span is not None:
                self._drop_workers()  # another iterator's, read to its end meanwhile
                self._kept = kept  # every worker ended its share: they wait for the next epoch
                _KEEPING.add(self)
            else:
                _stop_workers(items, _STOP_WAIT_S)

    def _group(self) -> int:
        """Batches per item from a worker: as many as hold :data:`~ferry.client.pipes.ITEM_BYTES` of tokens (1 to
        ``_GROUP_MAX``)."""
        return max(1, min(_GROUP_MAX, ITEM_BYTES // self._batch_bytes()))

    def _slots(self) -> Slots | None:
        """Shared-memory slots for new workers' token windows (see :mod:`ferry.client.slots`): enough per worker
        for the items DataLoader lets it build ahead, the one being read and one more. None in document mode, where
        processes cannot fork (workers that are not forked leave the slots out: see the module), and where they
        would hold more than :data:`SLOTS_MAX_BYTES` (huge batches, many workers): those items use the pipe."""
        if getattr(self.dataset, "mode", "tokens") != "tokens" or "fork" not in multiprocessing.get_all_start_methods():
            return None
        per_worker = self.prefetch_factor + 2
        item = Slots.item_bytes(self._group(), self._batch_bytes())
        if self.num_workers * per_worker * item > SLOTS_MAX_BYTES:
            return None
        return Slots(self.num_workers, per_worker, item)

    def _batch_bytes(self) -> int:
        """Bytes of one batch's windows of tokens as stored."""
        return self.batch_size * self._window_bytes()

    def _window_bytes(self) -> int:
        """Bytes of one sample's window of tokens as stored (``seq_len + 1`` tokens)."""
        return (self.dataset.seq_len + 1) * np.dtype(self.dataset.token_dtype).itemsize

    def _received(
        self, items: Iterator[tuple[_Item, dict[str, Any]]], slots: Slots | None
    ) -> Generator[Batch, None, None]:
        """The workers' batches as tensors, in order of ``k`` (advanced by the loop or, during its step, by the
        :class:`~ferry.client.stream.ahead.WhenIdle` helper). Windows a worker put in a shared slot are widened
        from there, and the slot freed once its last batch was."""
        pending: dict[int, dict[str, Any] | _Failure] = {}
        want = 0
        for item, grown in items:
            COUNTERS.absorb(grown)  # the worker's fetches and cache hits count in this process's stats
            if slots is not None:
                slots.received(item)
            pending.update(item)
            while want in pending:  # workers may finish out of turn; deliver in order of k
                payload = pending.pop(want)
                if isinstance(payload, _Failure):
                    payload.reraise()
                if slots is None:
                    batch = to_batch(payload, shared_labels=self.shared_labels)
                else:
                    # a copy: the slot is free for its worker after this
                    batch = to_batch(slots.windows(payload), shared_labels=self.shared_labels)
                    slots.done(payload)
                yield _pin(batch, self.shared_labels) if self.pin_memory else batch
                want += 1

    def trace(self, positions: Any = None, *, step: int | None = None) -> list[dict[str, Any]]:
        """Where samples came from (see :mod:`ferry.client.stream.trace`): stream ``positions``, or this rank's batch of
        global ``step`` (positions ``step * G + rank * batch_size ...``), or by default the next batch."""
        from .trace import trace_positions

        if positions is None:
            start = self._position if step is None else checks.integer("step", step, 0, 2**62) * self.global_batch_size
            positions = rank_positions(start, 0, self.batch_size, self.world_size, self.rank)
        with self._lock:
            return trace_positions(self.dataset, positions)

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable dict: what was delivered so far (``torch.distributed.checkpoint`` Stateful)."""
        with self._lock:
            span = self.dataset.epoch_span(self._position)
            record = self.dataset.record()
        return make_state(self._configured.identity(), self._position, span, skips=self._skips, **record)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, *, replan: bool = False) -> None:
        """Continue after the state's last delivered batch (any world size, workers or batch size).

        Raises StateError (one line naming the field) on a malformed state, strict or not, and on
        a state made for another dataset version, seed, seq_len or order configuration unless
        ``strict=False``. With ``replan=True`` a state of another mixture (other weights or schedule,
        sources added or removed) or of an older version of this dataset continues with this loader's
        plan from the state's position: every source that stays continues exactly, an added one starts
        at its beginning, and the change is recorded in later states (see ``ferry.client.resume.replan``).
        """
        saved = parse_state(state_dict)
        replan = checks.flag("replan", replan)
        with self._lock:
            dataset, position = resume(self._configured, saved, strict=strict, replan=replan)
        self.dataset, self._position, self._skips = dataset, position, saved.skips
        self._drop_workers()  # made again, from the dataset as it is now, by the next iter()

    def _drop_workers(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.stop()


class _KeptWorkers:
    """A DataLoader with persistent workers, what they were made for (``key``) and the shared ``span``
    ([start, count]) that tells them the plan of the next iteration."""

    def __init__(self, key: tuple[Any, ...], loader: DataLoader[Any], span: Any, slots: Slots | None) -> None:
        self.key, self.loader, self.span, self.slots = key, loader, span, slots

    def stop(self) -> None:
        items = getattr(self.loader, "_iterator", None)
        if items is not None:
            _stop_workers(items, _STOP_WAIT_S)


class _StallWatch:
    """Time the training loop spent waiting in ``next()`` against wall time; warns when the share is high."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.stall_s = self.wall_s = 0.0
        self.batches = self.delivered_bytes = 0
        self.first_batch_s: float | None = None
        self.resumed = 0.0
        self._window = [0.0, 0.0]  # stall, wall since the last judgement
        self._warned = False

    def step(self, wall: float, *, waited: float) -> None:
        """``wall`` seconds since the previous step, of which the last ``waited`` were spent in ``next()``."""
        waited = min(max(waited, 0.0), wall)
        if self.first_batch_s is None:
            self.first_batch_s = waited
        self.stall_s += waited
        self.wall_s += wall
        self._window[0] += waited
        self._window[1] += wall
        if self._window[1] >= _STALL_WINDOW_S:
            share = self._window[0] / self._window[1]
            if share > self.threshold:
                _log.warning(
                    "ferry loader: the training loop waited on data %.0f%% of the last %.0f s (%.1f s); raise "
                    "prefetch_bytes or fetch connections, or look at loader.stats() for a slow replica",
                    100 * share,
                    self._window[1],
                    self._window[0],
                )
            self._window = [0.0, 0.0]

    def delivered(self, nbytes: int) -> None:
        self.batches += 1
        self.delivered_bytes += nbytes

    def counters(self) -> dict[str, Any]:
        return {
            "stall_s": self.stall_s,
            "wall_s": self.wall_s,
            "batches": self.batches,
            "delivered_bytes": self.delivered_bytes,
        }


def rank_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """The given rank and world size, else the defaults of :func:`default_rank_world`, checked."""
    if rank is None or world_size is None:
        dr, dw = default_rank_world()
        rank, world_size = (dr if rank is None else rank), (dw if world_size is None else world_size)
    world = checks.integer("world_size", world_size, 1, SHAPE_LIMIT)
    r = checks.integer("rank", rank, 0, SHAPE_LIMIT)
    if r >= world:
        raise UsageError(f"invalid loader shape: rank={r} is not below world_size={world}")
    return r, world


def _worker_init(worker_id: int) -> None:
    """Set up a DataLoader worker so that it ends with the training process, however that ends.

    - It exits as soon as the process that started it is gone (SIGKILL, or SIGTERM with no handler: a
      preemption): :func:`~ferry.shard_tools.orphans.exit_with_parent`. Without it a worker inside a batch (a fetch
      in flight, a lock another process holds) never reaches DataLoader's own check of its parent.
    - SIGTERM ends it, whatever handler the training script installed before the fork: the worker is a copy
      of that process, and a handler meant for the training loop (set a flag, save a checkpoint) would keep
      the worker alive when DataLoader or multiprocessing terminates it.
    - SIGINT is ignored: Ctrl-C reaches every process of the terminal's group, and it is the training
      process's to act on (it stops the workers when its loop ends, or they exit with it).

    Only the worker's signal dispositions change; the training process's are left as they are.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()


def _stop_workers(items: Iterator[Any], grace: float) -> None:
    """Shut the DataLoader's worker processes down now rather than when ``items`` is collected, in bounded time.

    DataLoader stops its workers in the iterator's ``__del__``; an iterator left alive until
    interpreter exit (a reference cycle, a global) can leave the exit waiting on a worker that
    was never told to stop. ``_shutdown_workers`` is idempotent and is what ``__del__`` calls. It
    waits for each worker in turn (up to 5 s each) to finish the batch it is building; a worker still
    running after ``grace`` seconds is terminated instead (its batch would be dropped anyway).
    """
    shutdown = getattr(items, "_shutdown_workers", None)
    if shutdown is None:
        return
    workers = list(getattr(items, "_workers", ()))
    forget = getattr(_torch_signals, "_remove_worker_pids", None)
    if forget is not None and getattr(items, "_worker_pids_set", False):
        # stopping them is the point now: DataLoader's SIGCHLD handler must not report their end as a failure
        with contextlib.suppress(Exception):
            forget(id(items))
            items._worker_pids_set = False  # type: ignore[attr-defined]
    if sys.is_finalizing():  # no thread can start now (Thread.start would wait forever): no grace
        _terminate(workers)
        shutdown()
        return
    timer = threading.Timer(grace, _terminate, (workers,))
    timer.daemon = True
    timer.start()
    try:
        shutdown()
    finally:
        timer.cancel()


_LIVE: weakref.WeakSet[Generator[Batch, None, None]] = weakref.WeakSet()  # iterators not yet collected
_KEEPING: weakref.WeakSet[TokenLoader] = weakref.WeakSet()  # loaders that may hold kept workers


@atexit.register
def _at_exit() -> None:
    """Stop the workers of every loader still open when the interpreter exits, before multiprocessing's exit hook.

    That hook terminates the workers, and DataLoader's SIGCHLD handler then reports each as killed; an iterator
    collected later, during finalization, could no longer start the thread that bounds its wait. Closing an
    iterator runs its ``finally`` (as ``break`` or ``del`` would); one running in another thread is left as is.
    """
    for batches in list(_LIVE):
        with contextlib.suppress(ValueError):  # running in another thread
            batches.close()
    for loader in list(_KEEPING):
        loader._drop_workers()


def _terminate(workers: list[Any]) -> None:
    """SIGTERM each worker still running (its default action, see :func:`_worker_init`: it ends at once).

    Asks its sentinel, not ``is_alive()``, which would reap it under ``_shutdown_workers``'s ``join``."""
    for w in workers:
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile, or already gone
            if not connection.wait([w.sentinel], 0):
                os.kill(w.pid, signal.SIGTERM)


def _as_is(item: Any) -> Any:
    return item


def _pin(batch: Batch, shared_labels: bool) -> Batch:
    """``batch`` in pinned memory; shared labels stay a view of one pinned buffer with their inputs."""
    pinned = {k: v.pin_memory() for k, v in batch.items() if not (shared_labels and k in ("input_ids", "labels"))}
    if not shared_labels:
        return pinned
    ids, labels = batch["input_ids"], batch["labels"]
    b, length = ids.shape
    whole = torch.empty((b, length + 1), dtype=ids.dtype, pin_memory=True)
    whole[:, :-1] = ids
    whole[:, -1] = labels[:, -1]
    return {"input_ids": whole[:, :-1], "labels": whole[:, 1:], **pinned}
