"""The dev/test lock (requirements-dev.lock) matches pyproject.toml, and is what this venv runs."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import lockfile  # noqa: E402 - tools/ is not a package


def _pyproject() -> dict[str, object]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("lock", sorted(lockfile.LOCKS), ids=lambda p: p.name)
def test_lock_satisfies_every_requirement_of_pyproject(lock: Path) -> None:
    pins = lockfile.read_lock(lock.read_text())
    assert lockfile.mismatches(_pyproject(), pins, lock) == []
    assert "torch" in pins and pins["torch"].startswith("2.13.0")  # the CPU wheel on this machine's disk


def test_torchtitan_has_its_own_lock() -> None:
    """torchtitan caps datasets (and so fsspec/s3fs): the main environment must not carry it."""
    main = lockfile.read_lock(lockfile.LOCK.read_text())
    titan = lockfile.read_lock(lockfile.TITAN_LOCK.read_text())
    assert "torchtitan" in titan and "torchtitan" not in main


def test_a_requirement_added_without_a_new_lock_is_named() -> None:
    doc = _pyproject()
    project = dict(doc["project"])  # type: ignore[arg-type]
    project["dependencies"] = [*project["dependencies"], "not-a-locked-package>=1", "numpy>=999"]
    problems = lockfile.mismatches({"project": project}, lockfile.read_lock(lockfile.LOCK.read_text()))
    assert any(p.startswith("not-a-locked-package>=1: not in") for p in problems)
    assert any(p.startswith("numpy>=999: requirements-dev.lock pins") for p in problems)


def test_every_lock_line_is_pinned_with_a_hash() -> None:
    with pytest.raises(ValueError, match="not 'name==version"):
        lockfile.read_lock("numpy>=1\n")
    with pytest.raises(ValueError, match="not 'name==version"):
        lockfile.read_lock("numpy==2.0.0\n")
    text = lockfile.LOCK.read_text()
    assert len(lockfile.read_lock(text)) == sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))


def test_this_environment_runs_the_locked_versions() -> None:
    """What `make test` installed is what the lock names (a hand-installed package would show here)."""
    pins = lockfile.read_lock(lockfile.LOCK.read_text())
    wrong = {}
    for name, version in pins.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if installed != version:
            wrong[name] = (version, installed)
    assert wrong == {}
