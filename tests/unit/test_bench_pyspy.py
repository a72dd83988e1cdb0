"""The bench's py-spy profiles: an aside that never ends a suite."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import pyspy  # noqa: E402


def _fake_pyspy(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_a_profile_that_runs_past_its_timeout_is_reported_not_raised(tmp_path: Path) -> None:
    spy = _fake_pyspy(tmp_path, "exec sleep 30")
    text = pyspy.top(spy, ["true"], dict(os.environ), timeout=0.5)
    assert text == "py-spy ran past 0.5 s: no profile"


def test_py_spy_samples_without_pausing_the_process(tmp_path: Path) -> None:
    args = tmp_path / "args"
    # records its arguments and writes one folded stack where -o points
    lines = [f'echo "$@" > {args}', 'while [ "$1" != "-o" ]; do shift; done', 'echo "main;work 3" > "$2"']
    spy = _fake_pyspy(tmp_path, "\n".join(lines))
    text = pyspy.top(spy, ["true"], dict(os.environ))
    assert "--nonblocking" in args.read_text().split()
    assert "100.0  work" in text
