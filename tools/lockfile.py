"""The dev/test lock: every package of ``.[all,torchtitan]`` pinned with its sha256, resolved by pip itself.

    python tools/lockfile.py write   # resolve the dev extras under constraints-dev.txt, write requirements-dev.lock
    python tools/lockfile.py check   # the lock still satisfies every requirement of pyproject.toml

``make lock`` runs ``write``; ``make test`` and ``make demo`` install from the lock with
``pip install --require-hashes`` and then the project itself with ``--no-deps``, so a fresh
clone gets exactly the versions (and the very files) the lock names. ``check`` runs in
``make test`` (tests/test_lockfile.py): a requirement added to pyproject.toml without a new
lock fails there, naming it. The package's own metadata keeps unpinned ranges.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-dev.lock"
CONSTRAINTS = ROOT / "constraints-dev.txt"
PROJECT = "ferry"
#: What the dev/test environment installs: everything, plus the torchtitan integration's extra
#: (kept out of ``all``: torchtitan caps datasets and so fsspec/s3fs for every user).
DEV_EXTRAS = ("all", "torchtitan")
_HEADER = """\
# The dev/test environment of ferry, fully pinned with hashes: `make lock` writes it
# (tools/lockfile.py: pip resolves .[all,torchtitan] under constraints-dev.txt), `make test` / `make demo`
# install it with --require-hashes. Do not edit by hand.
"""
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(python: str = sys.executable) -> list[tuple[str, str, str]]:
    """(name, version, sha256) of everything ``pip install .[DEV_EXTRAS]`` would install here, but ferry."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
             "-c", str(CONSTRAINTS), f"{ROOT}[{','.join(DEV_EXTRAS)}]"],
            check=True,
        )  # fmt: skip
        items = json.loads(report.read_text())["install"]
    out = []
    for item in items:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if _normal(name) == PROJECT:
            continue
        digest = (item["download_info"].get("archive_info") or {}).get("hashes", {}).get("sha256")
        if not digest:
            raise SystemExit(f"pip reported no sha256 for {name} {version}: cannot lock it")
        out.append((_normal(name), version, digest))
    return sorted(out)


def write() -> None:
    pins = resolve()
    LOCK.write_text(_HEADER + "".join(f"{n}=={v} --hash=sha256:{h}\n" for n, v, h in pins))
    print(f"wrote {LOCK.relative_to(ROOT)}: {len(pins)} packages")


def read_lock(text: str) -> dict[str, str]:
    """name → pinned version; every line must be ``name==version --hash=sha256:…``."""
    pins: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"{LOCK.name}:{n}: not 'name==version --hash=sha256:…': {line!r}")
        pins[_normal(m.group(1))] = m.group(2)
    return pins


def requirements(pyproject: dict[str, object], extras_wanted: Iterable[str] = DEV_EXTRAS) -> Iterator[str]:
    """Every requirement string of the core install plus ``extras_wanted``, ferry's own extras expanded."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    seen: set[str] = set()

    def expand(reqs: Iterable[str]) -> Iterator[str]:
        for req in reqs:
            m = re.match(rf"^{PROJECT}\[([^\]]+)\]$", req.replace(" ", ""))
            if m is None:
                yield req
                continue
            for name in m.group(1).split(","):
                if name not in seen:
                    seen.add(name)
                    yield from expand(extras[name])

    yield from project.get("dependencies", [])
    yield from expand([f"{PROJECT}[{','.join(extras_wanted)}]"])


def mismatches(pyproject: dict[str, object], pins: dict[str, str]) -> list[str]:
    """Requirements of pyproject.toml (for this interpreter and platform) the lock does not satisfy."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    out = []
    for text in requirements(pyproject):
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pinned = pins.get(_normal(req.name))
        if pinned is None:
            out.append(f"{text}: not in {LOCK.name}")
        elif not req.specifier.contains(Version(pinned), prereleases=True):
            out.append(f"{text}: {LOCK.name} pins {pinned}")
    return out


def check() -> int:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    problems = mismatches(pyproject, read_lock(LOCK.read_text()))
    for p in problems:
        print(f"{LOCK.name} is out of date: {p} (run `make lock`)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "write":
        write()
    elif command == "check":
        sys.exit(check())
    else:
        sys.exit(__doc__)
