"""The dev/test locks: every package pinned with its sha256, resolved by pip itself.

    python tools/lockfile.py write   # resolve under constraints-dev.txt, write both locks
    python tools/lockfile.py check   # the locks still satisfy every requirement of pyproject.toml

``requirements-dev.lock`` is ``.[all]``: the environment of ``make test`` and ``make demo``.
``requirements-titan.lock`` is ``.[loader,torchtitan]`` plus pytest, for the torchtitan
integration test in its own venv (``.venv-titan``): torchtitan caps ``datasets`` below 4.8 and
so fsspec/s3fs at 2026.2, and the main environment keeps testing the releases ``all`` installs.
``make lock`` runs ``write``; ``make test`` installs each lock with ``pip install
--require-hashes`` and then the project itself with ``--no-deps``, so a fresh clone gets exactly
the versions (and the very files) the locks name. ``check`` runs in ``make test``
(tests/unit/test_lockfile.py): a requirement added to pyproject.toml without a new lock fails there,
naming it. The package's own metadata keeps unpinned ranges.
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
TITAN_LOCK = ROOT / "requirements-titan.lock"
CONSTRAINTS = ROOT / "constraints-dev.txt"
PROJECT = "ferry-data"
#: lock file → (ferry's extras, further requirements) it pins
LOCKS: dict[Path, tuple[tuple[str, ...], tuple[str, ...]]] = {
    LOCK: (("all",), ()),
    TITAN_LOCK: (("loader", "torchtitan"), ("pytest>=8", "pytest-timeout>=2.3")),
}
_HEADER = """\
# A dev/test environment of ferry, fully pinned with hashes: `make lock` writes it
# (tools/lockfile.py: pip resolves {what} under constraints-dev.txt), `make test`
# installs it with --require-hashes. Do not edit by hand.
"""
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _target(extras: tuple[str, ...]) -> str:
    return f"{ROOT}[{','.join(extras)}]"


def resolve(extras: tuple[str, ...], more: tuple[str, ...], python: str = sys.executable) -> list[tuple[str, str, str]]:
    """(name, version, sha256) of everything ``pip install .[extras] more…`` would install here, but ferry."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
             "-c", str(CONSTRAINTS), _target(extras), *more],
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
    for lock, (extras, more) in LOCKS.items():
        pins = resolve(extras, more)
        what = " ".join([f".[{','.join(extras)}]", *more])
        lock.write_text(_HEADER.format(what=what) + "".join(f"{n}=={v} --hash=sha256:{h}\n" for n, v, h in pins))
        print(f"wrote {lock.relative_to(ROOT)}: {len(pins)} packages")


def read_lock(text: str) -> dict[str, str]:
    """name → pinned version; every line must be ``name==version --hash=sha256:…``."""
    pins: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"line {n}: not 'name==version --hash=sha256:…': {line!r}")
        pins[_normal(m.group(1))] = m.group(2)
    return pins


def requirements(pyproject: dict[str, object], extras_wanted: Iterable[str] = ("all",)) -> Iterator[str]:
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


def mismatches(pyproject: dict[str, object], pins: dict[str, str], lock: Path = LOCK) -> list[str]:
    """Requirements of pyproject.toml (for this interpreter and platform) ``lock``'s pins do not satisfy."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    extras, more = LOCKS[lock]
    out = []
    for text in [*requirements(pyproject, extras), *more]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pinned = pins.get(_normal(req.name))
        if pinned is None:
            out.append(f"{text}: not in {lock.name}")
        elif not req.specifier.contains(Version(pinned), prereleases=True):
            out.append(f"{text}: {lock.name} pins {pinned}")
    return out


def check() -> int:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    problems = [p for lock in LOCKS for p in mismatches(pyproject, read_lock(lock.read_text()), lock)]
    for p in problems:
        print(f"out of date: {p} (run `make lock`)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "write":
        write()
    elif command == "check":
        sys.exit(check())
    else:
        sys.exit(__doc__)
