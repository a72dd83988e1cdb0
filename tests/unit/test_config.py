"""ferry.toml parsing: a full example, defaults, and precise errors."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from configs import Api, Cluster, FerryToml, Limits, Rule

from ferry.service.config import format_rate, link_name, load_config, parse_config, parse_rate, redact
from ferry.shard_tools.errors import ConfigError

FULL = """
state_dir = "state"
poll_interval = 15
keep_versions = 2
scrub_interval = 86400

[clusters.lake]
url = "s3://corp-lake/datasets"
priority = 50
[clusters.lake.storage_options]
key = "$LAKE_KEY"
secret = "${LAKE_SECRET}"
client_kwargs = { endpoint_url = "http://127.0.0.1:9000" }

[clusters.eu]
url = "/data/ferry"
priority = 10

[clusters.us]
url = "file:///mnt/us"

[[rules]]
datasets = "fineweb-*"
from = "lake"
to = ["eu", "us"]

[[rules]]
datasets = "*"
from = "eu"
to = "*"

[limits]
transfers = 8
bwlimit = "1GiB/s"
per_link = { "lake->eu" = "100MiB/s", "lake->us" = "50M" }

[api]
host = "0.0.0.0"
port = 9000
token_env = "MY_TOKEN"
read_protected = true
sla_minutes = 30
"""


def test_full_example(tmp_path: Path) -> None:
    p = tmp_path / "ferry.toml"
    p.write_text(FULL)
    cfg = load_config(p, env={"LAKE_KEY": "AKIA", "LAKE_SECRET": "s3cr3t"})
    assert list(cfg.clusters) == ["lake", "eu", "us"]
    lake = cfg.clusters["lake"]
    assert lake.storage_options == {"key": "AKIA", "secret": "s3cr3t",
                                    "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}  # fmt: skip
    assert "s3cr3t" not in repr(lake) and "AKIA" not in repr(cfg)
    assert cfg.rules[0].destinations == ("eu", "us") and cfg.rules[0].matches("fineweb-edu")
    assert not cfg.rules[0].matches("c4")
    assert cfg.rules[1].destinations == ("lake", "us")  # "*" = every other cluster
    assert cfg.limits.transfers == 8 and cfg.limits.bwlimit == 2**30
    assert cfg.limits.per_link == {"lake->eu": 100 * 2**20, "lake->us": 50e6}
    assert cfg.state_dir == tmp_path / "state" and cfg.poll_interval == 15 and cfg.keep_versions == 2
    assert cfg.scrub_interval == 86400
    assert (cfg.api.host, cfg.api.port, cfg.api.token_env, cfg.api.read_protected, cfg.api.sla_minutes) == (
        "0.0.0.0", 9000, "MY_TOKEN", True, 30.0)  # fmt: skip
    assert ("lake", "eu") in cfg.links() and ("eu", "lake") in cfg.links()


def test_defaults() -> None:
    cfg = parse_config(
        FerryToml(clusters={"a": Cluster("/a"), "b": Cluster("memory://b")}, rules=[Rule("a", "*")]).doc()
    )
    assert cfg.limits.transfers == 4 and cfg.limits.bwlimit is None and cfg.keep_versions == 3
    assert cfg.scrub_interval is None and cfg.api.port == 8765 and cfg.api.read_protected is False


BASE = FerryToml(clusters={"a": Cluster("/a"), "b": Cluster("/b")}, rules=[Rule("a", ["b"])]).doc()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"rules": [{"from": "x", "to": ["b"]}]}, "unknown cluster 'x'"),
        ({"rules": [{"from": "a", "to": ["c"]}]}, "unknown cluster 'c'"),
        ({"rules": [{"from": "a", "to": ["a"]}]}, "also the source"),
        ({"rules": [{"from": "a", "to": "b"}]}, 'list of cluster names or "\\*"'),
        ({"clusters": {"a": {"url": "nosuch://x"}, "b": {"url": "/b"}}}, "unknown URL scheme 'nosuch'"),
        ({"clusters": {"a": {"url": "s3://u:p@bucket"}, "b": {"url": "/b"}}}, "credentials must not be embedded"),
        (
            {"clusters": {"a": {"url": "/a", "storage_options": {"secret": "plain"}}, "b": {"url": "/b"}}},
            "credentials must not be written",
        ),  # fmt: skip
        (
            {"clusters": {"a": {"url": "/a", "storage_options": {"token": "$NOPE_NOT_SET"}}, "b": {"url": "/b"}}},
            "NOPE_NOT_SET is not set",
        ),  # fmt: skip
        ({"limits": {"bwlimit": "fast"}}, "cannot read rate 'fast'"),
        ({"limits": {"transfers": 0}}, "limits.transfers"),
        ({"limits": {"per_link": {"a->z": "1M"}}}, "two known clusters"),
        ({"poll_interval": -1}, "poll_interval"),
        ({"keep_versions": 0}, "keep_versions"),
        ({"colour": "blue"}, "unknown key"),
        ({"api": {"token": "abc"}}, "unknown key"),
        ({"api": {"read_protected": "yes"}}, "true or false"),
    ],
)
def test_errors(patch: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, **patch}, env={})


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[clusters\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "bad.toml")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100MiB/s", 100 * 2**20),
        ("1.5G", 1.5e9),
        ("500k", 5e5),
        ("10KiB", 10240),
        (2048, 2048.0),
        ("off", None),
        (0, None),
        ("1TiB/s", 2**40),
    ],  # fmt: skip
)
def test_parse_rate(text: object, value: float | None) -> None:
    assert parse_rate(text) == value  # type: ignore[arg-type]


def test_helpers() -> None:
    assert link_name("a", "b") == "a->b"
    assert format_rate(None) == "off" and format_rate(100 * 2**20) == "100.0MiB/s"
    assert redact("s3://user:pw@bucket/path?X-Amz-Signature=abc") == "s3://bucket/path"
    assert redact("/plain/path") == "/plain/path"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"poll_interval": float("inf")}, r"^poll_interval: expected a finite number, got inf$"),
        ({"poll_interval": float("nan")}, r"^poll_interval: expected a finite number"),
        ({"scrub_interval": float("nan")}, r"^scrub_interval: expected a finite number"),
        ({"scrub_interval": float("inf")}, r"^scrub_interval: expected a finite number"),
        ({"scrub_interval": False}, r"^scrub_interval: expected a number, got False$"),
        ({"api": {"sla_minutes": float("nan")}}, r"^api\.sla_minutes: expected a finite number"),
        ({"limits": {"bwlimit": float("nan")}}, r"^limits\.bwlimit: expected a finite number"),
        ({"limits": {"per_link": {"a->b": float("inf")}}}, r"^limits\.per_link\.a->b: expected a finite number"),
    ],
)
def test_numbers_must_be_finite(patch: dict, message: str) -> None:
    """An infinite poll_interval overflows the daemon's wait and a NaN one spins it without polling."""
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, **patch}, env={})


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"limits": {"transfers": 0}}, r"^limits\.transfers: must be >= 1, got 0$"),
        ({"limits": {"transfers": "8"}}, r"^limits\.transfers: expected an integer, got '8'$"),
        ({"api": {"max_connections": 2}}, r"^api\.max_connections: must be >= 8, got 2$"),
        ({"api": {"port": 70000}}, r"^api\.port: must be <= 65535, got 70000$"),
        ({"clusters": {"a b": {"url": "/a"}, "b": {"url": "/b"}}}, r"^clusters\.a b: cluster names use letters"),
        ({"clusters": {"a": {"url": ""}, "b": {"url": "/b"}}}, r"^clusters\.a\.url: must be a non-empty string"),
        ({"clusters": {"a": {"priority": 1}, "b": {"url": "/b"}}}, r"^clusters\.a\.url: required key is missing$"),
        ({"clusters": {"a": "/a", "b": {"url": "/b"}}}, r"^clusters\.a: expected a table"),
        ({"clusters": {}}, r"^clusters: \[clusters\.NAME\] sections are required"),
        ({"rules": []}, r"^rules: at least one \[\[rules\]\] entry is required$"),
        ({"rules": [{"from": "a", "to": ["b"], "dataset": "x"}]}, r"^rules\[0\]: unknown key\(s\) dataset \(allowed: "),
        ({"rules": [{"to": ["b"]}]}, r"^rules\[0\]\.from: required key is missing$"),
        ({"rules": [{"from": "a", "to": ["b"], "datasets": "x/y"}]}, r"^rules\[0\]\.datasets: expected a glob"),
        ({"colour": "blue", "shade": 1}, r"^ferry\.toml: unknown key\(s\) colour, shade \(allowed: api, cluster, "),
        ({"api": {"token": "abc"}}, r"^api\.token: unknown key; put the token in an environment variable"),
    ],
)
def test_error_messages_name_the_key(patch: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config({**BASE, **patch}, env={})
    assert "pydantic" not in str(info.value) and "Input should" not in str(info.value)


def test_every_problem_is_listed_and_no_option_value_is_shown() -> None:
    doc = {**BASE, "keep_versions": 0, "limits": {"retries": 0}, "api": {"port": -1}}
    doc["clusters"] = {"a": {"url": "/a", "storage_options": "s3cr3t-value"}, "b": {"url": "/b"}}
    with pytest.raises(ConfigError) as info:
        parse_config(doc, env={})
    lines = str(info.value).splitlines()
    assert lines == [
        "4 problems in ferry.toml",
        "  clusters.a.storage_options: expected a table",
        "  limits.retries: must be >= 1, got 0",
        "  keep_versions: must be >= 1, got 0",
        "  api.port: must be >= 0, got -1",
    ]


def test_parse_api_alone_names_the_section() -> None:
    from ferry.service.config import ApiConfig, parse_api

    assert parse_api({}) == ApiConfig() and parse_api({"port": 0}).port == 0
    with pytest.raises(ConfigError, match=r"^api: expected a table"):
        parse_api(["port", 1])
    with pytest.raises(ConfigError, match=r"^api\.read_protected: expected true or false, got 'yes'$"):
        parse_api({"read_protected": "yes"})


def test_reading_a_file_without_pydantic_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The models load with the first file read; without the 'service' extra that says what to install."""
    import ferry.service
    from ferry.shard_tools.errors import UsageError

    monkeypatch.setitem(sys.modules, "pydantic", None)  # as if pydantic were not installed
    monkeypatch.delitem(sys.modules, "ferry.service.config_schema", raising=False)
    monkeypatch.delattr(ferry.service, "config_schema", raising=False)
    with pytest.raises(UsageError, match=r"the 'service' extra \(pydantic\): pip install 'ferry-data\[service\]'"):
        parse_config(BASE, env={})


def test_the_tests_config_builder_writes_what_it_means(tmp_path: Path) -> None:
    """tests/configs.py: the text parses back to its doc(), and ferry reads both alike."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    options = {"key": "$K", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}, "anon": False}
    toml = FerryToml(
        clusters={"lake": Cluster("s3://lake/ds", priority=5, storage_options=options), "eu": Cluster(tmp_path / "eu")},
        rules=[Rule("lake", ["eu"], datasets="web-*"), Rule("eu", "*")],
        limits=Limits(transfers=3, bwlimit="1GiB/s", per_link={"lake->eu": 2.5e6}),
        api=Api(port=0, read_protected=True, header_timeout=2.5),
        state_dir="st ate",
        scrub_interval=0,
        cluster="eu",
    )
    assert tomllib.loads(toml.text()) == toml.doc()
    assert toml.doc()["rules"][0] == {"from": "lake", "to": ["eu"], "datasets": "web-*"}
    assert "poll_interval" not in toml.doc() and "retries" not in toml.doc()["limits"]  # None: ferry's default
    loaded = load_config(toml.write(tmp_path / "ferry.toml"), env={"K": "v"})
    parsed = parse_config(toml.doc(), base_dir=tmp_path, env={"K": "v"})
    assert loaded == replace(parsed, source_path=tmp_path / "ferry.toml")
    assert loaded.state_dir == tmp_path / "st ate" and loaded.limits.per_link == {"lake->eu": 2.5e6}
    assert loaded.api.read_protected and loaded.api.header_timeout == 2.5 and loaded.scrub_interval is None
