"""Profiles of ferry's CLIs with py-spy (sampling, all threads — cProfile sees only the main thread).

py-spy lives in the peers' venv (a standalone binary); it records a command and we fold its raw
stacks into the top functions by own time and by inclusive time.
"""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
from pathlib import Path

__all__ = ["top"]

_IDLE = re.compile(
    r"^(Condition\.wait|Event\.wait|Thread\._wait_for_tstate_lock|\w*Selector\.select|_worker \(concurrent)"
)


def _fold(raw: str, n: int, skip_imports: bool = False) -> str:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        if skip_imports and ("_find_and_load" in stack or "finalize._exitfunc" in stack):
            continue  # interpreter start-up and shutdown, not the code under test
        if skip_imports and _IDLE.search(stack.rsplit(";", 1)[-1]):
            continue  # a parked thread (progress monitor, idle pool worker), not work
        total += c
        frames = stack.split(";")
        own[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    if not total:
        return "(no samples)"
    what = "all threads; imports and parked threads excluded" if skip_imports else "all threads"
    out = [f"{total} samples ({what})", "", "own%   function (file:line)"]
    out += [f"{100 * c / total:5.1f}  {f}" for f, c in own.most_common(n)]
    out += ["", "incl%  function (file:line)"]
    out += [f"{100 * c / total:5.1f}  {f}" for f, c in incl.most_common(n)]
    return "\n".join(out)


def top(
    pyspy: str,
    cmd: list[str],
    env: dict[str, str],
    n: int = 15,
    timeout: float = 300,
    rate: int = 200,
    skip_imports: bool = False,
) -> str:
    """Run ``cmd`` under ``py-spy record`` and return its top functions as text (or why there are none: a
    profile is an aside, and its failure never ends a suite).

    ``--nonblocking``: py-spy reads the stacks without pausing the process; paused at every sample, a loader's
    short run can take many times its length, mostly in system time, and pass the timeout."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        try:
            proc = subprocess.run(
                [pyspy, "record", "--nonblocking", "-r", str(rate), "-f", "raw", "-o", str(raw), "--", *cmd],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return f"py-spy ran past {timeout:g} s: no profile"
        if not raw.exists():
            return f"py-spy failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
        return _fold(raw.read_text(), n, skip_imports)
