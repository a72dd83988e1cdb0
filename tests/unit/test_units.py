"""ferry.shard_tools.units: the one table of sizes and rates, and the one byte formatter."""

from __future__ import annotations

import pytest

from ferry.shard_tools.errors import ConfigError, UsageError
from ferry.shard_tools.units import format_bytes, format_rate, parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("1KB", 1000), ("1k", 1000), ("2KiB", 2048), ("128MiB", 128 * 2**20), ("1 GB", 10**9),
     ("1.5TiB", int(1.5 * 2**40)), ("7b", 7), (12, 12)],
)  # fmt: skip
def test_parse_size(text: str | int, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MiB", "-1MiB", "0", "3 parsecs", "1XiB"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="cannot read size"):
        parse_size(text)


def test_size_and_rate_share_one_table() -> None:
    for unit in ("K", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"):
        assert parse_rate(f"3{unit}B/s") == parse_size(f"3{unit}B")


def test_parse_rate_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^limits\.bwlimit: cannot read rate 'fast'"):
        parse_rate("fast", "limits.bwlimit")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 * 2**30, "5.0 GiB"), (2**50, "1024.0 TiB")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_format_rate() -> None:
    assert format_rate(None) == "off" and format_rate(0) == "off"
    assert format_rate(100 * 2**20) == "100.0MiB/s" and format_rate(12) == "12.0B/s"
