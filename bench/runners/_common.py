"""What every runner shares (stdlib only: runners execute in ferry's venv or in the peers' venv).

A runner is started as ``python RUNNER.py '<json args>'`` and prints one JSON object as its last
stdout line. Times are measured inside the runner, after imports, so interpreter start-up and
import cost are excluded for every tool alike.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["args", "cpu_seconds", "emit", "peak_rss_mb", "now", "profiled", "dir_bytes"]

now = time.perf_counter


def args() -> dict[str, Any]:
    """The JSON arguments the harness passed."""
    return dict(json.loads(sys.argv[1])) if len(sys.argv) > 1 else {}


def _own_peak_kib() -> float:
    """This process image's peak RSS (KiB): ``VmHWM``, which starts afresh at exec. ``ru_maxrss`` does not:
    Linux carries it over from the forked parent's image, so every runner would report at least the RSS
    the benchmark driver had when it started the runner."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def peak_rss_mb() -> dict[str, float]:
    """Peak resident set size of this process and of its largest finished child (MiB, Linux KiB units)."""
    own = _own_peak_kib() / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mb": round(own, 1), "peak_rss_children_mb": round(kids, 1)}


def _descendants_cpu(root: int) -> float:
    """CPU seconds (user + system) of the live descendants of process ``root``, from ``/proc`` (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        except OSError:
            continue  # gone meanwhile
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)  # fields[1]: the parent's id
        times[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    total, todo = 0.0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def cpu_seconds() -> float:
    """CPU seconds this process and all its descendants used so far: its own threads, the children it reaped,
    and the ones still running (DataLoader workers). The difference of two readings is what a stretch of work
    cost in CPU time, wherever it ran. This process and its reaped children are read in microseconds
    (``getrusage``; ``os.times`` counts in clock ticks, 10 ms here, a twentieth of a cold epoch); live
    descendants in clock ticks (``/proc``)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + _descendants_cpu(os.getpid())


def dir_bytes(path: str) -> int:
    """Total size of the files under ``path``."""
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(base, name))
    return total


def profiled(fn: Callable[[], dict[str, Any]], top: int = 18) -> dict[str, Any]:
    """Run ``fn`` under cProfile; add the top functions by own time to its result."""
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    start = text.find("   ncalls")
    result["profile"] = text[start:] if start >= 0 else text
    return result


def emit(result: dict[str, Any]) -> None:
    """Print the result as the last stdout line (with peak RSS added)."""
    result.update(peak_rss_mb())
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
