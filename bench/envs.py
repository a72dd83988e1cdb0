"""The peers' virtualenv, Debian's rclone, and what the machine and every tool's version are.

Peers live in ``.venv-bench`` (git-ignored) so they never leak into ferry's ``.venv``. It is created
once and stamped with the constraints file it was built from.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import log

__all__ = ["PeersVenv", "ensure_peers_venv", "ensure_rclone", "machine", "versions"]

PEER_PACKAGES = [
    "torch",
    "torchvision",
    "litdata",
    "mosaicml-streaming",
    "megatron-energon[s3]",  # the s3 extra: multi-storage-client with boto3, for S3-compatible remotes
    "matplotlib",
    "psutil",
    "zstandard",
    "pyarrow",
    "py-spy",
]


class PeersVenv:
    """Creating ``.venv-bench`` in the background: pip mostly unpacks wheels (I/O), so the corpus can be
    generated meanwhile. :meth:`wait` gives the peers' python, or None when the install failed."""

    def __init__(self, repo: Path) -> None:
        self.venv = repo / ".venv-bench"
        self.py = self.venv / "bin" / "python"
        self.constraints = repo / "constraints-bench.txt"
        self.stamp = self.venv / ".installed"
        self.want = self.constraints.read_text()
        self.proc: subprocess.Popen[str] | None = None
        self.error: str | None = None
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 — lives as long as the install
        if self.ready():
            return
        log(
            "creating .venv-bench for the peers (litdata, mosaicml-streaming, megatron-energon; "
            "torch 2.14.1 + torchvision 0.29.1)"
        )
        try:
            if not self.py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
            self.proc = subprocess.Popen(
                [str(self.py), "-m", "pip", "install", "-q", "-c", str(self.constraints), *PEER_PACKAGES],
                stdout=subprocess.DEVNULL,
                stderr=self.log,  # a file, not a pipe: pip's many index warnings would fill a pipe and block it
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            self.error = str(exc)

    def ready(self) -> bool:
        return self.py.exists() and self.stamp.exists() and self.stamp.read_text() == self.want

    def wait(self) -> str | None:
        if self.proc is not None:
            self.proc.wait()
            if self.proc.returncode != 0:
                self.log.seek(0)
                self.error = f"pip exit {self.proc.returncode}: {self.log.read()[-800:]}"
            else:
                self.stamp.write_text(self.want)
            self.proc = None
        if self.error:
            log(f"peers' venv failed ({self.error}); peers are skipped")
            return None
        return str(self.py) if self.ready() else None


def ensure_peers_venv(repo: Path) -> str | None:
    """Path of the peers' python, creating ``.venv-bench`` when missing or stale; None on failure."""
    return PeersVenv(repo).wait()


def ensure_rclone() -> str | None:
    """Debian's rclone, installed with apt-get when missing and we are root; None when unavailable."""
    found = shutil.which("rclone")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("installing Debian's rclone")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (
            ["apt-get", "install", "-y", "-qq", "rclone"],
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "rclone"],
        ):
            ok = subprocess.run(cmd, env=env, capture_output=True).returncode == 0
            if ok and cmd[1] == "install":
                break
    return shutil.which("rclone")


def commit(repo: Path) -> str | None:
    """The commit measured, ``+changes`` where tracked files differ from it (results of earlier runs aside: each
    run rewrites ``bench/results/latest.json``); None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"],
                               cwd=repo, capture_output=True, text=True)  # fmt: skip
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model, OS."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpu_model": model or platform.processor(),
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


_VERSION_CODE = """
import json, importlib.metadata as m
out = {}
for name in %r:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def _pkg_versions(python: str, names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run([python, "-c", _VERSION_CODE % (names,)], capture_output=True, text=True, timeout=60)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return {}


def versions(ferry_python: str, peers_python: str | None, rclone: str | None) -> dict[str, Any]:
    """Versions of ferry, the peers and the libraries under them, per venv."""
    common = ["numpy", "pyarrow", "zstandard", "torch"]
    out: dict[str, Any] = {"ferry_venv": _pkg_versions(ferry_python, ["ferry", "fsspec", "s3fs", "moto", *common])}
    if peers_python:
        peers = ["litdata", "mosaicml-streaming", "megatron-energon", "multi-storage-client", "torchvision"]
        out["peers_venv"] = _pkg_versions(peers_python, [*peers, "matplotlib", *common])
    if rclone:
        try:
            first = subprocess.run([rclone, "version"], capture_output=True, text=True).stdout.splitlines()[0]
            out["rclone"] = first.split()[-1]
        except (OSError, IndexError):
            pass
    with contextlib.suppress(OSError, IndexError):
        out["cp"] = subprocess.run(["cp", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return out
