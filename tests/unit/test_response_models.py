"""The API's response models are built from the records of ferry.client.service.service_types, which own their
fields: the model adds only descriptions, bounds and narrower string types."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pydantic
import pytest

from ferry.client.service import service_types as wire
from ferry.service.api import models
from ferry.service.api.models import response_model


@dataclass(frozen=True)
class _Point:
    t: float


@dataclass(frozen=True)
class _Series:
    name: str
    kind: str
    points: list[_Point]
    step: float | None = None
    tags: list[str] = field(default_factory=list)
    last: _Point | None = None


def test_a_model_has_its_records_fields_and_adds_only_what_the_api_states() -> None:
    point = response_model(_Point, "PointOut", "A point.")
    series = response_model(
        _Series,
        "SeriesOut",
        "A series of points.",
        kind={"annotation": Literal["a", "b"]},
        step={"description": "seconds between points", "ge": 0},
    )
    schema = series.model_json_schema()
    assert list(schema["properties"]) == ["name", "kind", "points", "step", "tags", "last"]
    assert schema["required"] == ["name", "kind", "points"] and schema["additionalProperties"] is False
    assert schema["description"] == "A series of points." and schema["title"] == "SeriesOut"
    assert schema["properties"]["kind"]["enum"] == ["a", "b"]
    assert schema["properties"]["points"]["items"] == {"$ref": "#/$defs/PointOut"}  # the nested record's model
    assert schema["properties"]["last"]["anyOf"] == [{"$ref": "#/$defs/PointOut"}, {"type": "null"}]
    step = schema["properties"]["step"]
    assert step["description"] == "seconds between points" and step["default"] is None
    built = series(name="x", kind="a", points=[point(t=1.0)])
    assert built.model_dump() == {
        "name": "x",
        "kind": "a",
        "points": [{"t": 1.0}],
        "step": None,
        "tags": [],
        "last": None,
    }
    with pytest.raises(pydantic.ValidationError):
        series(name="x", kind="c", points=[])  # not one of the values the API states
    with pytest.raises(pydantic.ValidationError):
        series(name="x", kind="a", points=[], step=-1.0)
    with pytest.raises(pydantic.ValidationError):
        series(name="x", kind="a", points=[], surprise=1)


def test_a_model_refuses_to_describe_a_field_its_record_lacks() -> None:
    with pytest.raises(TypeError, match=r"SeriesOut: colour not a field of _Series"):
        response_model(_Series, "SeriesOut", "A series.", colour={"description": "no such field"})


@pytest.mark.parametrize(
    ("record", "model"),
    [
        (wire.Cluster, models.ClusterOut),
        (wire.DatasetSummary, models.DatasetSummary),
        (wire.DatasetDetail, models.DatasetDetail),
        (wire.ReplicaCell, models.ReplicaCell),
        (wire.ReplicaMatrix, models.ReplicaMatrix),
        (wire.Transfer, models.TransferOut),
        (wire.HistoryEntry, models.HistoryEntry),
        (wire.ErrorEntry, models.ErrorEntry),
        (wire.Link, models.LinkOut),
        (wire.Throughput, models.ThroughputOut),
        (wire.ThroughputPoint, models.ThroughputPoint),
        (wire.Limits, models.LimitsOut),
        (wire.OtherWriter, models.OtherWriterOut),
        (wire.Status, models.StatusOut),
        (wire.ActionResult, models.ActionResult),
    ],
)
def test_every_response_model_is_its_record(record: type, model: type[pydantic.BaseModel]) -> None:
    assert issubclass(model, pydantic.BaseModel)
    assert list(model.model_fields) == [f.name for f in dataclasses.fields(record)]
    for f in dataclasses.fields(record):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert model.model_fields[f.name].is_required() is not has_default, (model.__name__, f.name)


def test_the_daemons_records_are_the_apis_records() -> None:
    from ferry.service import records

    assert records.HistoryEntry is wire.HistoryEntry and records.LimitsInfo is wire.Limits
    assert records.ClusterInfo is wire.Cluster and records.TransferInfo is wire.Transfer
    assert records.ErrorInfo is wire.ErrorEntry
