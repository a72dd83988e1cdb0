"""Pin the public face of ``client`` and the flags of ``ferry serve``, ``ferry status`` and ``ferry lease`` exactly: a
name or flag added or removed fails here, so the change is made on purpose (and in the README).

The flags are read from ``ferry CMD --help``, what a user sees, so how the CLI is built may change."""

from __future__ import annotations

import re

import pytest

from ferry import client
from ferry.shard_tools.cli import main

CLIENT_EXPORTS = {
    "TokenDataset", "MixedDataset", "TokenLoader", "MediaDataset", "MediaMixture", "MediaLoader", "ServiceClient",
}  # fmt: skip

SERVE_FLAGS = {
    "-h", "--help", "-c", "--config", "--log-level", "--log-format", "--drain-timeout", "--host", "--port",
    "--no-api", "--access-log",
}  # fmt: skip
STATUS_FLAGS = {
    "-h", "--help", "--server", "--token", "--token-env", "--json", "--watch", "--interval", "--timeout",
}  # fmt: skip
LEASE_SHOW_FLAGS = {"-h", "--help", "--storage-option", "-S", "--json"}
LEASE_BREAK_FLAGS = LEASE_SHOW_FLAGS | {"--yes", "-y", "--if-holder"}

# an option at the start of a help line, or after ", " (its aliases): "  --config CONFIG, -c CONFIG"
_OPTION = re.compile(r"(?:^\s{1,8}|, )(--?[A-Za-z][\w-]*)")


def help_flags(text: str) -> set[str]:
    """Every option string in the ``options:`` section of an argparse ``--help`` text."""
    head, sep, section = text.partition("\noptions:\n")
    assert sep, f"no options section in:\n{text}"
    return {m.group(1) for line in section.splitlines() for m in _OPTION.finditer(line)}


def command_help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_client_exports_exactly() -> None:
    assert set(client.__all__) == CLIENT_EXPORTS and len(client.__all__) == len(CLIENT_EXPORTS)
    namespace: dict[str, object] = {}
    exec("from ferry.client import *", namespace)  # what a star import hands out is __all__, each one resolved
    assert {k for k in namespace if k != "__builtins__"} == CLIENT_EXPORTS
    for name in CLIENT_EXPORTS:
        assert getattr(client, name).__name__ == name


@pytest.mark.parametrize(
    ("command", "expected"),
    [("serve", SERVE_FLAGS), ("status", STATUS_FLAGS), ("lease show", LEASE_SHOW_FLAGS),
     ("lease break", LEASE_BREAK_FLAGS)],
)  # fmt: skip
def test_service_command_flags_exactly(command: str, expected: set[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = command_help(command, capsys)
    assert text.startswith(f"usage: ferry {command} ")
    assert help_flags(text) == expected


def test_help_flags_sees_every_option() -> None:
    """The parser of the help text itself: aliases, metavars and wrapped descriptions."""
    text = """usage: ferry x [-h]

options:
  -h, --help            show this help message and exit
  --config CONFIG, -c CONFIG
                        path to ferry.toml (default: ./ferry.toml, see --other)
  --log-level {debug,info}
  --no-api              run without the API
"""
    assert help_flags(text) == {"-h", "--help", "--config", "-c", "--log-level", "--no-api"}
