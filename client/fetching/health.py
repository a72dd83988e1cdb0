"""What one process has seen of each replica of a dataset, and the order it asks them in from that.

Replicas are given nearest first, and asked in that order until one misbehaves:

- every request has a deadline, ``floor + slack * (latency + bytes / rate)`` from the round trip and
  per-connection rate observed on that replica (:class:`Link`; a conservative prior before the first transfer);
- a replica past a deadline (the request is hedged) is asked last from then on; one that never answered
  (hung) stays behind every replica that did answer, even one slow once since, until it answers;
- a replica that fails a read (an error, or an answer that fails its check) is asked last for later reads
  of the same kind (shards, or manifests); one that merely lacks an object (a partial replica, e.g. the
  daemon's destination still being filled) keeps its place, so the objects it holds keep being read from it.

:class:`ReplicaHealth` is that record, and what the hedged race (:func:`ferry.client.fetching.fetch.race`) tells
of each attempt; it counts each outcome in :data:`ferry.client.stats.COUNTERS` under the replica's shown name.
"""

from __future__ import annotations

import threading
from typing import Any

from ..stats import COUNTERS
from .fetch import FetchOptions, Missing

__all__ = ["Link", "ReplicaHealth", "MANIFESTS", "SHARDS"]

SHARDS, MANIFESTS = "shards", "manifests"  # the kinds of read a replica is ranked for
_SMALL = 256 << 10  # a request this small measures the round trip, a larger one the rate
_EWMA = 0.3


class Link:
    """What one replica's link has shown: round trip and per-connection rate (moving averages)."""

    def __init__(self, options: FetchOptions) -> None:
        self.latency = options.prior_latency
        self.rate = options.prior_rate

    def expected(self, nbytes: int) -> float:
        return self.latency + nbytes / self.rate

    def observe(self, nbytes: int, seconds: float) -> None:
        if nbytes <= _SMALL:
            self.latency += _EWMA * (seconds - self.latency)
        else:
            rate = nbytes / max(seconds - self.latency, seconds / 4, 1e-4)
            self.rate += _EWMA * (rate - self.rate)


class ReplicaHealth:
    """Links, failures, hedges and hung replicas of one dataset's replicas (``names``, nearest first), and the
    order each kind of read asks them in. Thread-safe; per process (it pickles without its lock)."""

    def __init__(self, names: list[str], options: FetchOptions) -> None:
        self.names = names
        self.options = options
        self._orders = {kind: list(range(len(names))) for kind in (SHARDS, MANIFESTS)}
        self._links = [Link(options) for _ in names]
        self._hung: set[int] = set()  # passed a deadline and never answered: behind the others until it does
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None  # re-made in the receiving process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def fresh_lock(self) -> None:
        """A new lock after a fork (another thread of the parent may have held the old one)."""
        self._lock = threading.Lock()

    def order(self, kind: str) -> list[int]:
        """The replicas in the order reads of ``kind`` ask them now (a copy)."""
        with self._lock:
            return list(self._orders[kind])

    def tries(self, order: list[int], exclude: frozenset[int] = frozenset()) -> list[int]:
        """Whom a read asks, in turn: ``order`` without ``exclude`` (all of it when that leaves none); when some
        replica never answered, a hedge goes to a new connection of the first one that does before it."""
        with self._lock:
            tries = [i for i in order if i not in exclude] or list(order)
            answering = [i for i in tries if i not in self._hung]
            if answering and len(answering) < len(tries):
                tries = [*answering[:1], *answering, *[i for i in tries if i in self._hung]]
        return tries

    def deadline(self, i: int, nbytes: int) -> float:
        """Seconds a request of ``nbytes`` to replica ``i`` may take before it is hedged."""
        opts = self.options
        return opts.deadline_floor + opts.deadline_slack * self._links[i].expected(nbytes)

    def answered(self, i: int, nbytes: int, seconds: float) -> None:
        """Replica ``i`` gave a good answer of ``nbytes`` in ``seconds``: its link learns, and it is not hung."""
        COUNTERS.request(self.names[i], nbytes, seconds, "ok")
        self._links[i].observe(nbytes, seconds)
        if i in self._hung:
            with self._lock:
                self._hung.discard(i)

    def refused(self, i: int, nbytes: int, seconds: float, kind: str) -> None:
        """Replica ``i``'s answer failed its check (a bad copy, a server that ignores Range): asked last for reads
        of ``kind``."""
        COUNTERS.request(self.names[i], nbytes, seconds, "failed")
        self._demote(i, kind)

    def failed(self, i: int, exc: BaseException, seconds: float, kind: str) -> str:
        """Replica ``i``'s request raised ``exc``: ``"missing"`` when it lacks the object (it keeps its place),
        else ``"failed"`` (asked last for reads of ``kind``)."""
        if isinstance(exc, (FileNotFoundError, Missing)):
            COUNTERS.request(self.names[i], 0, seconds, "missing")
            return "missing"
        COUNTERS.request(self.names[i], 0, seconds, "failed")
        self._demote(i, kind)
        return "failed"

    def hedged(self, i: int) -> None:
        """Replica ``i`` passed its deadline (the request goes to the next one too): asked last from now on."""
        COUNTERS.hedged(self.names[i])
        self._demote(i)

    def unanswered(self, replicas: list[int]) -> None:
        """``replicas`` passed their deadline and never answered: behind every replica that did, until they do."""
        with self._lock:
            self._hung.update(replicas)
        for i in replicas:
            self._demote(i)

    def _demote(self, i: int, kind: str | None = None) -> None:
        """Replica ``i`` last for reads of ``kind`` (of every kind when None), but ahead of the hung ones (unless
        it is one of them)."""
        with self._lock:
            for k, o in self._orders.items():
                if (kind is None or k == kind) and i in o:
                    o.remove(i)
                    hung = [n for n, j in enumerate(o) if j in self._hung]
                    o.insert(len(o) if i in self._hung or not hung else hung[0], i)
