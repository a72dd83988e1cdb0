"""``[[links]]`` in ferry.toml: names, lists and ``*`` expand to one spec per link, a later entry wins, and
every mistake names its key."""

from __future__ import annotations

import pytest

from ferry.service.config import LinkSpec, parse_config
from ferry.shard_tools.errors import ConfigError

BASE = {
    "clusters": {"a": {"url": "/tmp/a"}, "b": {"url": "/tmp/b"}, "c": {"url": "/tmp/c"}},
    "rules": [{"from": "a", "to": "*"}],
}


def test_links_expand_and_a_later_entry_wins() -> None:
    links = [
        {"from": "*", "to": "*", "capacity": "1.25GB/s", "price_per_gb": 0.02},
        {"from": "a", "to": ["b"], "capacity": 5e9, "price_per_gb": 0.09, "rtt": 0.05},
    ]
    cfg = parse_config({**BASE, "links": links})
    assert len(cfg.link_specs) == 6  # every ordered pair of distinct clusters
    assert cfg.link_specs[("a", "b")] == LinkSpec("a", "b", 5e9, 0.09, 0.05)
    assert cfg.link_specs[("b", "a")] == LinkSpec("b", "a", 1.25e9, 0.02, 0.0)


def test_no_links_is_the_default() -> None:
    assert parse_config(BASE).link_specs == {}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"from": "z", "to": "*"}, r"^links\[0\]\.from: unknown cluster 'z'"),
        ({"from": "a", "to": "b", "price_per_gb": -1}, r"^links\[0\]\.price_per_gb: must be >= 0"),
        ({"from": "a", "to": "b", "rtt": float("nan")}, r"^links\[0\]\.rtt: expected a finite number"),
        ({"from": "a", "to": "b", "capacity": "fast"}, r"^links\[0\]\.capacity: cannot read rate"),
        ({"from": "a", "to": "b", "cap": 1}, r"^links\[0\]: unknown key\(s\) cap"),
        ({"from": "a", "to": []}, r"^links\[0\]\.to: expected a list of cluster names"),
        ({"to": "b"}, r"^links\[0\]\.from: required key is missing"),
    ],
)
def test_a_bad_link_names_its_key(entry: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, "links": [entry]})
