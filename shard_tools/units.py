"""Sizes and rates as people write them, and bytes as people read them: one table for all of ferry.

K, M, G, T are powers of 1000 and Ki, Mi, Gi, Ti powers of 1024 (the SI/IEC letters; rclone reads
"M" as MiB, ferry does not). ``ferry pack --shard-size``, the loader's byte budgets, ``ferry.toml``'s
rates and every byte count ferry prints go through here.
"""

from __future__ import annotations

import re

from .errors import ConfigError, UsageError

__all__ = ["parse_size", "parse_rate", "format_bytes", "format_rate"]

#: multiplier of each unit prefix, keyed by its lower-case letters ("" is plain bytes)
PREFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_BINARY = ("", "Ki", "Mi", "Gi", "Ti")
_SIZE_EXAMPLES = "examples: 128MiB, 1GB, 4096"
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?)?B?(?:/s)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"128MiB"``, ``"1GB"``, ``"4096"`` → bytes; anything else is a UsageError."""
    if isinstance(text, int):
        return text
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    prefix = unit[:-1] if unit.endswith("b") else unit
    try:
        value = float(num)
    except ValueError:
        raise UsageError(f"cannot read size {text!r} ({_SIZE_EXAMPLES})") from None
    if prefix not in PREFIXES or value <= 0:
        raise UsageError(f"cannot read size {text!r} ({_SIZE_EXAMPLES})")
    return int(value * PREFIXES[prefix])


def parse_rate(value: str | float | int | None, where: str = "rate") -> float | None:
    """``"100MiB/s"``, ``"1.5G"``, ``"500k"``, a number of bytes/s, or ``0``/``"off"``/None → bytes/s or None.

    ``where`` names the setting in the ConfigError a bad value raises.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a rate such as '100MiB/s', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{where}: rate must not be negative ({value})")
        return float(value) or None
    text = str(value).strip()
    if text.lower() in ("", "off", "none", "unlimited", "0"):
        return None
    m = _RATE.match(text)
    if not m:
        raise ConfigError(f"{where}: cannot read rate {value!r} (examples: '100MiB/s', '1.5GB/s', '500k')")
    rate = float(m.group(1)) * PREFIXES[(m.group(2) or "").lower()]
    return rate or None


def _scaled(n: float) -> tuple[float, str]:
    """``n`` in the largest binary unit that keeps it below 1024 (up to Ti), and that unit's prefix."""
    for prefix in _BINARY:
        if abs(n) < 1024 or prefix == _BINARY[-1]:
            return n, prefix
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_bytes(n: float) -> str:
    """bytes → ``"512 B"``, ``"1.5 KiB"``, ``"3.2 GiB"``."""
    value, prefix = _scaled(n)
    return f"{value:.1f} {prefix}B" if prefix else f"{value:.0f} B"


def format_rate(rate: float | None) -> str:
    """bytes/s → ``"100.0MiB/s"`` (``"off"`` for none), as ``ferry.toml`` writes rates."""
    if not rate:
        return "off"
    value, prefix = _scaled(rate)
    return f"{value:.1f}{prefix}B/s"
