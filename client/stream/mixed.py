"""``MixedDataset``: several sample sources drawn by weight, each position's source a pure function of it."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.shard_tools.errors import InvalidValueError, StateError, UsageError

from ..checks import show
from ..resume.replan import merge_plan, source_keys
from ..sampling.mixing import check_weights
from ..sampling.partition import distinct
from ..sampling.schedule import MAX_START, Schedule
from ..source import SampleSource

__all__ = ["MixedDataset"]


class MixedDataset(SampleSource):
    """Several datasets drawn by weight; position ``p``'s source is a pure function of ``p``.

    Each source keeps its own endless stream (its own epochs and shuffle); an epoch of the
    mixture is defined as the sum of the sources' sample counts. ``weights`` is one weight per
    dataset, or a schedule: a list of phases ``(start, weights)`` — from global sample ``start``
    (the first phase at 0) on, draw with these weights (0 leaves a dataset out of the phase).
    """

    def __init__(self, datasets: Sequence[SampleSource], weights: Sequence[Any]) -> None:
        phases = _phases(datasets, weights)
        lengths = {d.seq_len for d in datasets}
        modes = {d.mode for d in datasets}
        if len(lengths) != 1 or len(modes) != 1:
            raise UsageError(f"mixed datasets must share seq_len and mode, got {sorted(lengths)} / {sorted(modes)}")
        try:
            self.schedule = Schedule.from_weights(phases)
        except InvalidValueError:
            raise
        except ValueError as exc:
            raise InvalidValueError(str(exc)) from exc
        self.sources = list(datasets)
        self.config = self.schedule  # what this mixture was built with; ``schedule`` also holds the run's past
        self._slots: list[SampleSource | None] = list(self.sources)  # the dataset of each source of ``schedule``
        self._keys = source_keys([d.identity() for d in self.sources])
        self._plan: dict[str, Any] = {
            "sources": [_entry(k, d) for k, d in zip(self._keys, self.sources, strict=True)],
            "phases": [[s, list(q)] for s, q in self.schedule.phases],
            "anchor": 0,
        }
        self.seq_len = lengths.pop()
        self.mode = modes.pop()
        self.token_dtype = np.result_type(*[d.token_dtype for d in datasets])
        self.num_samples = sum(d.num_samples for d in datasets)
        self.prefetch_depth = max(d.prefetch_depth for d in datasets)

    def __repr__(self) -> str:
        if len(self.schedule.phases) == 1:
            return f"MixedDataset({self.sources!r}, weights={self.schedule.weights})"
        return f"MixedDataset({self.sources!r}, phases={self.schedule.phases})"

    def identity(self) -> dict[str, Any]:
        idents = [d.identity() for d in self.sources]
        ident = {
            "dataset_version": [i["dataset_version"] for i in idents],
            "seed": [i["seed"] for i in idents],
            "seq_len": self.seq_len,
            "quota": self.schedule.quota.tolist(),
            "sources": idents,
        }
        if len(self.config.phases) > 1:  # a single phase keeps the identity (and states) of a plain mixture
            ident["phases"] = [[s, list(q)] for s, q in self.config.phases]
        return ident

    def record(self) -> dict[str, Any]:
        return {"plan": copy.deepcopy(self._plan)}

    def restored(self, saved: Any) -> MixedDataset:
        """This mixture with the phases and sources of the state's plan (which must end in this configuration)."""
        plan = saved.plan
        if plan is None:  # a version-1 state of this very mixture: no history
            return self
        union = [s["key"] for s in plan["sources"]]
        phases = [(s, tuple(q)) for s, q in plan["phases"]]
        expect = merge_plan(union, phases, self._keys, self.config.phases, plan["anchor"])
        if expect != (union, phases):
            raise StateError("loader state plan does not end in the mixture of its fingerprint: the state is corrupt")
        return self._with(plan)

    def replanned(self, saved: Any) -> tuple[MixedDataset, int]:
        """This mixture continuing the run of ``saved`` from its position: a new phase there."""
        plan, position = self._old_plan(saved)
        plan = self._continue_versions(plan, position)
        union = [s["key"] for s in plan["sources"]]
        phases = [(s, tuple(q)) for s, q in plan["phases"]]
        keys, merged = merge_plan(union, phases, self._keys, self.config.phases, position)
        added = [_entry(k, d) for k, d in zip(self._keys, self.sources, strict=True) if k not in union]
        entries = plan["sources"] + added
        assert [e["key"] for e in entries] == keys
        new = {"sources": entries, "phases": [[s, list(q)] for s, q in merged], "anchor": position}
        return self._with(new), position

    def _continue_versions(self, plan: dict[str, Any], position: int) -> dict[str, Any]:
        """The plan with each source that this mixture has in a newer version (same URL, seed, shuffle, mode;
        shards appended) renamed to it: that source continues from where it stands (see ``TokenDataset``)."""
        from ..resume.state import SavedState

        keys = {s["key"] for s in plan["sources"]}
        drawn = Schedule([(s, q) for s, q in plan["phases"]]).drawn(position).tolist()
        entries = [dict(e) for e in plan["sources"]]
        for k, d in zip(self._keys, self.sources, strict=True):
            if k in keys or not hasattr(d, "with_eras"):
                continue
            ident = d.identity()
            for j, e in enumerate(entries):
                old = e["identity"]
                same = e["url"] == d.url and {**old, "dataset_version": None} == {**ident, "dataset_version": None}
                if not same or e["key"] in self._keys or old == ident:
                    continue
                own = SavedState(2, old["dataset_version"], old["seed"], old["seq_len"], 0, 0,
                                 e["key"].split("#")[0], position=drawn[j], eras=e["eras"])  # fmt: skip
                continued, _ = d.replanned(own)
                entries[j] = {**_entry(k, d), "eras": continued.record().get("eras", [])}
                break
        return {**plan, "sources": entries}

    def _old_plan(self, saved: Any) -> tuple[dict[str, Any], int]:
        """The plan of the state's run and its position; a single dataset's run is a one-source plan."""
        if saved.plan is not None:
            return saved.plan, saved.position
        if isinstance(saved.dataset_version, list):
            raise StateError(
                "loader state of a mixture written by a ferry without plans cannot be re-planned: resume it once "
                "with the mixture it was made with, save a new state, and re-plan from that one"
            )
        key = f"{saved.fingerprint}#0"
        match = [d for k, d in zip(self._keys, self.sources, strict=True) if k == key]
        if not match:
            raise StateError(
                f"loader state is of one dataset (version {saved.dataset_version}, seed {saved.seed}) that is none of "
                "this mixture's sources with the same seed, shuffle and mode; a re-plan must keep it"
            )
        position = saved.stream_position(match[0].num_samples, strict=True)
        return {"sources": [_entry(key, match[0])], "phases": [[0, [1]]], "anchor": 0}, position

    def _with(self, plan: dict[str, Any]) -> MixedDataset:
        """A copy reading with ``plan`` (sources it no longer has are None: no position ahead draws them)."""
        out = copy.copy(self)
        by_key = dict(zip(self._keys, self.sources, strict=True))
        out._slots = []
        for s in plan["sources"]:
            d = by_key.get(s["key"])
            # a source continued from an older version reads its earlier epochs as that version had them
            out._slots.append(d.with_eras(s["eras"]) if d is not None and s["eras"] else d)  # type: ignore[attr-defined]
        out.schedule = Schedule([(s, q) for s, q in plan["phases"]])
        out._plan = copy.deepcopy(plan)
        return out

    def with_plan(self, plan: dict[str, Any]) -> MixedDataset:
        """A copy that reads with ``plan`` (a state's ``plan``: its sources must be this mixture's, by key)."""
        missing = [s["url"] or s["key"] for s in plan["sources"] if s["key"] not in self._keys]
        if missing:
            raise StateError(f"the plan names sources this mixture does not have: {missing}")
        return self._with(plan)

    @property
    def plan(self) -> dict[str, Any]:
        """The run's plan: sources (key, identity, url), phases ``[start, quota per source]``, last re-plan."""
        return copy.deepcopy(self._plan)

    def source_at(self, slot: int) -> SampleSource:
        """The dataset of source ``slot`` of the plan (StateError for a source this mixture no longer has)."""
        d = self._slots[slot]
        if d is None:
            entry = self._plan["sources"][slot]
            raise StateError(
                f"source {slot} of the plan ({entry['url'] or entry['key']}) is not in this mixture any more; "
                "add it back to read the positions it served"
            )
        return d

    def _split(self, positions: np.ndarray) -> Iterator[tuple[SampleSource, np.ndarray, np.ndarray]]:
        src, idx = self.schedule.locate(positions)
        for j in distinct(src):
            sel = np.nonzero(src == j)[0]
            yield self.source_at(j), idx[sel], sel

    def fill(self, positions: np.ndarray, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        for source, idx, sel in self._split(positions):
            source.fill(idx, rows[sel], out)

    def boundaries(self, positions: np.ndarray) -> list[list[int]]:
        result: list[list[int]] = [[] for _ in range(len(positions))]
        for source, idx, sel in self._split(positions):
            for i, b in zip(sel.tolist(), source.boundaries(idx), strict=True):
                result[i] = b
        return result

    def prefetch(self, positions: np.ndarray) -> None:
        for source, idx, _ in self._split(positions):
            source.prefetch(idx)

    def settle(self) -> None:
        for d in self.sources:
            d.settle()

    def raise_deferred(self) -> None:
        for d in self.sources:
            d.raise_deferred()

    def close(self) -> None:
        for d in self.sources:
            d.close()


def _entry(key: str, d: SampleSource) -> dict[str, Any]:
    return {"key": key, "identity": d.identity(), "url": d.url, "eras": []}


def _phases(datasets: Any, weights: Any) -> list[tuple[int, list[float]]]:
    """``weights`` as a list of phases ``(start, weights)``: one phase from 0 for a plain list of weights."""
    for name, value in (("datasets", datasets), ("weights", weights)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise UsageError(f"mix takes a list of {name}, got {show(value)}")
    if not datasets:
        raise UsageError("mix needs at least one dataset")
    for d in datasets:
        if not isinstance(d, SampleSource):
            raise UsageError(f"mix takes TokenDatasets (or MixedDatasets), got {show(d)}")
    if weights and all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[1], Sequence) for p in weights):
        phases = [(_start(s), _weights(datasets, w, zero_ok=True)) for s, w in weights]
        if phases[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(phases, phases[1:], strict=False)):
            raise UsageError(f"a schedule's phase starts must increase from 0, got {[s for s, _ in phases]}")
        return phases
    return [(0, _weights(datasets, weights, zero_ok=False))]


def _start(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < MAX_START:
        raise UsageError(f"a phase starts at a global sample number (an integer in [0, 2**62)), got {show(value)}")
    return int(value)


def _weights(datasets: Sequence[Any], weights: Any, *, zero_ok: bool) -> list[float]:
    """As many real, finite weights as datasets: positive (or, in a phase of a schedule, zero; one positive)."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != len(datasets):
        n = len(weights) if isinstance(weights, Sequence) else show(weights)
        raise UsageError(f"mix needs one weight per dataset ({len(datasets)} datasets, {n} weights)")
    return check_weights(weights, zero_ok=zero_ok)
