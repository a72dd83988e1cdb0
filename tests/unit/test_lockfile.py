"""The dev/test locks (`make lock`: uv pip compile) match pyproject.toml, and are what this venv runs.

A requirement added to or tightened in pyproject.toml, requirements-titan.in or constraints-dev.txt
without running `make lock` fails here, naming it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DEV_LOCK, ROOT, TITAN_LOCK, locked_versions, normal_name
from packaging.requirements import Requirement
from packaging.version import Version

PROJECT = "ferry-data"
CONSTRAINTS = ROOT / "constraints-dev.txt"
TITAN_IN = ROOT / "requirements-titan.in"
#: lock → ferry's extras it pins and its further requirements files, as the Makefile's `lock` target has them
LOCKS: dict[Path, tuple[tuple[str, ...], tuple[Path, ...]]] = {
    DEV_LOCK: (("all",), ()),
    TITAN_LOCK: (("loader", "torchtitan"), (TITAN_IN,)),
}


def _pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]


def requirements(pyproject: dict[str, Any], extras_wanted: Iterable[str]) -> Iterator[str]:
    """Every requirement string of the core install plus ``extras_wanted``, ferry's own extras expanded."""
    project = pyproject["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    seen: set[str] = set()

    def expand(names: Iterable[str]) -> Iterator[str]:
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            for req in extras[name]:
                parsed = Requirement(req)
                if normal_name(parsed.name) == PROJECT:
                    yield from expand(parsed.extras)
                else:
                    yield req

    yield from project.get("dependencies", [])
    yield from expand(extras_wanted)


def mismatches(pyproject: dict[str, Any], constraints: list[str], lock: Path) -> list[str]:
    """The requirements (for this interpreter and platform) and constraints ``lock``'s pins do not satisfy."""
    pins = locked_versions(lock.read_text(), lock.name)
    extras, files = LOCKS[lock]
    wanted = [(text, True) for text in [*requirements(pyproject, extras), *(ln for f in files for ln in _lines(f))]]
    out = []
    for text, needed in [*wanted, *((text, False) for text in constraints)]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pinned = pins.get(normal_name(req.name))
        if pinned is None:
            if needed:  # a constraint only bounds what is installed anyway
                out.append(f"{text}: not in {lock.name}")
        elif not req.specifier.contains(Version(pinned), prereleases=True):
            out.append(f"{text}: {lock.name} pins {pinned}")
    return out


@pytest.mark.parametrize("lock", sorted(LOCKS), ids=lambda p: p.name)
def test_lock_satisfies_every_requirement_of_pyproject(lock: Path) -> None:
    problems = mismatches(_pyproject(), _lines(CONSTRAINTS), lock)
    assert problems == [], "out of date, run `make lock`:\n" + "\n".join(problems)
    pins = locked_versions(lock.read_text(), lock.name)
    assert pins["torch"] == "2.13.0+cpu"  # the CPU wheel on this machine's disk, not a CUDA build
    assert PROJECT not in pins  # make test installs ferry itself from the checkout


def test_torchtitan_has_its_own_lock() -> None:
    """torchtitan caps datasets (and so fsspec/s3fs): the main environment must not carry it."""
    main = locked_versions(DEV_LOCK.read_text())
    titan = locked_versions(TITAN_LOCK.read_text())
    assert "torchtitan" in titan and "torchtitan" not in main
    assert "pytest" in titan and "pytest-timeout" in titan  # requirements-titan.in


def test_a_requirement_added_without_a_new_lock_is_named() -> None:
    doc = _pyproject()
    project = dict(doc["project"])
    project["dependencies"] = [*project["dependencies"], "not-a-locked-package>=1", "numpy>=999"]
    problems = mismatches({"project": project}, [], DEV_LOCK)
    assert any(p.startswith("not-a-locked-package>=1: not in requirements-dev.lock") for p in problems)
    assert any(p.startswith("numpy>=999: requirements-dev.lock pins") for p in problems)
    extras = dict(project["optional-dependencies"])
    extras["gcs"] = [*extras["gcs"], "gcsfs>=9999"]  # reached only through ferry-data[…,gcs,…] in `all`
    problems = mismatches({"project": {**project, "optional-dependencies": extras}}, [], DEV_LOCK)
    assert any(p.startswith("gcsfs>=9999: requirements-dev.lock pins") for p in problems)


def test_a_constraint_changed_without_a_new_lock_is_named() -> None:
    problems = mismatches(
        {"project": {"optional-dependencies": {"loader": [], "torchtitan": []}}},
        ["torch==2.14.0+cpu", "not-a-locked-package==1"],
        TITAN_LOCK,
    )
    assert "torch==2.14.0+cpu: requirements-titan.lock pins 2.13.0+cpu" in problems
    assert not any("not-a-locked-package" in p for p in problems)  # bounds what is installed, adds nothing


def test_every_lock_entry_is_pinned_with_a_hash() -> None:
    with pytest.raises(ValueError, match="x.lock: not 'name==version"):
        locked_versions("numpy>=1\n", "x.lock")
    with pytest.raises(ValueError, match="not 'name==version"):
        locked_versions("numpy==2.0.0 \\\n    # via ferry-data\n")
    digest = "0" * 64
    two = (
        f"numpy==2.0.0 \\\n    --hash=sha256:{digest} \\\n    --hash=sha256:{digest}\n    # via x\n"
        f"Zstd_Y==1\\\n --hash=sha256:{digest}\n"
    )
    assert locked_versions(two) == {"numpy": "2.0.0", "zstd-y": "1"}
    for lock in LOCKS:
        text = lock.read_text()
        starts = [ln for ln in text.splitlines() if ln and not ln[0].isspace() and not ln.startswith("#")]
        assert len(locked_versions(text, lock.name)) == len(starts) > 50


def test_this_environment_runs_the_locked_versions() -> None:
    """What `make test` installed is what the lock names (a hand-installed package would show here)."""
    pins = locked_versions(DEV_LOCK.read_text())
    wrong: dict[str, tuple[str, str | None]] = {}
    for name, version in pins.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if installed != version:
            wrong[name] = (version, installed)
    assert wrong == {}
