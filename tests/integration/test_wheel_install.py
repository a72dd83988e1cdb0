"""ferry as a user installs it: the wheel built from this checkout, in a fresh virtual environment with only
the extras a role needs (versions pinned by the lock), away from the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import DEV_LOCK, locked_versions

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("client", "service", "shard_tools")

pytestmark = pytest.mark.slow


def run(*cmd: str | Path, cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # what the Dockerfile copies: the build needs no more
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for pkg in GENERIC:  # a copy: the build writes build/ and *.egg-info beside its sources
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", out, src, cwd=out)
    (built,) = out.glob("ferry_data-*.whl")
    return built


def test_the_wheel_installs_only_under_ferry(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = z.namelist()
    assert tops == {"ferry", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    assert "ferry/__init__.py" not in names  # a namespace package: nothing but the three subpackages under it
    for pkg in GENERIC:
        assert f"ferry/{pkg}/__init__.py" in names and f"ferry/{pkg}/py.typed" in names
    assert any(n.startswith("ferry/service/static/") for n in names)
    # every module of every subpackage: a subpackage missing from pyproject's explicit list would be left out
    sources = {f"ferry/{p.relative_to(ROOT).as_posix()}" for pkg in GENERIC for p in (ROOT / pkg).rglob("*.py")}
    assert len(sources) > 100
    assert sorted(sources - set(names)) == []


def test_a_fresh_environment_packs_and_trains_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """The data engineer's install (no extras) runs `ferry --help` and `ferry pack`; adding the loader extra
    gives `from ferry.client import TokenDataset`; no generic top-level module is importable."""
    env_dir, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    venv.create(env_dir, with_pip=True)
    py, ferry = env_dir / "bin" / "python", env_dir / "bin" / "ferry"
    pins = tmp_path / "pins.txt"  # the lock's versions, without hashes: the wheel itself has none there
    pins.write_text("".join(f"{n}=={v}\n" for n, v in locked_versions(DEV_LOCK.read_text()).items()))
    run(py, "-m", "pip", "install", "--quiet", "--no-compile", "-c", pins, wheel, cwd=work)

    assert "pack" in run(ferry, "--help", cwd=work)
    (work / "c.jsonl").write_text("".join(json.dumps({"tokens": list(range(i, i + 50))}) + "\n" for i in range(40)))
    run(ferry, "pack", "c.jsonl", "--vocab-size", "1000", "--eos-id", "999", "--out", "ds", cwd=work)
    assert "documents" in run(ferry, "inspect", "ds", cwd=work)
    probe = f"import importlib.util as u; print([m for m in {GENERIC!r} if u.find_spec(m) is not None])"
    assert run(py, "-c", probe, cwd=work).strip() == "[]"
    assert "torch" not in run(py, "-m", "pip", "list", "--format", "freeze", cwd=work)

    run(py, "-m", "pip", "install", "--quiet", "--no-compile", "-c", pins, f"{wheel}[loader]", cwd=work)
    read = (
        "from ferry.client import TokenDataset, TokenLoader\n"
        "ds = TokenDataset('ds', seq_len=16, cache_dir='cache')\n"
        "print(sum(b['input_ids'].numel() for b in TokenLoader(ds, batch_size=4, rank=0, world_size=1)))\n"
    )
    assert int(run(py, "-c", read, cwd=work)) > 0
