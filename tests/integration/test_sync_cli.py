"""`ferry sync`: JSON report, no-op, --verify-only, S3 options, exit codes, progress bar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import documents, make_docs, pack

from ferry.service.cli import main
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.storage.store import resolve


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(["sync", *argv])
    out, err = capsys.readouterr()
    try:
        return code, json.loads(out), err
    except json.JSONDecodeError:
        return code, out, err


def test_sync_json_noop_and_verify_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = make_docs(300, 41)
    result = pack(str(tmp_path / "src"), docs, {})
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    code, report, _ = run(capsys, src, dst, "--json", "--transfers", "3")
    assert code == 0 and report["published"] and report["copied"] == result.shards
    assert report["copied_bytes"] == result.stored_bytes and report["failed"] == []
    assert documents(dst, {}) == [d.tolist() for d in docs]
    code, report, _ = run(capsys, src, dst, "--json")
    assert code == 0 and report["up_to_date"] and report["copied"] == 0
    code, text, _ = run(capsys, src, dst)
    assert code == 0 and "nothing to do" in text
    code, report, _ = run(capsys, src, dst, "--verify-only", "--json")
    assert code == 0 and report["verified"] == result.shards and report["failed"] == []
    victim = open_dataset(dst).manifest.shards[3].path
    loc = resolve(dst)
    data = bytearray(loc.read_bytes(victim))
    data[0] ^= 1
    loc.write_bytes(victim, bytes(data))
    code, report, _ = run(capsys, src, dst, "--verify-only", "--json")
    assert code == 1 and [f["shard"] for f in report["failed"]] == [victim]


def test_sync_to_s3_with_options(tmp_path: Path, s3_backend: Any, capsys: pytest.CaptureFixture[str]) -> None:
    docs = make_docs(200, 42)
    pack(str(tmp_path / "src"), docs, {})
    endpoint = s3_backend.storage_options["client_kwargs"]["endpoint_url"]
    dst = s3_backend.url("synced")
    code, report, err = run(
        capsys,
        str(tmp_path / "src"),
        dst,
        "--json",
        "--dst-option",
        "key=testing",
        "--dst-option",
        "secret=testing",
        "-S",
        f"client_kwargs.endpoint_url={endpoint}",
    )
    assert code == 0, err
    assert report["published"] and report["destination"] == dst
    assert documents(dst, s3_backend.storage_options) == [d.tolist() for d in docs]


def test_progress_bar_and_bwlimit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pack(str(tmp_path / "src"), make_docs(300, 43), {})
    code, text, err = run(capsys, str(tmp_path / "src"), str(tmp_path / "dst"), "--progress", "--bwlimit", "4MiB/s")
    assert code == 0 and "published" in text and "sync" in err and "B/s" in err
    assert main(["sync", str(tmp_path / "src"), str(tmp_path / "x"), "--bwlimit", "lots"]) == 2
    assert "cannot read rate 'lots'" in capsys.readouterr().err


def test_ferry_sync_exits_nonzero_on_unrepaired_failure(tmp_path: Path) -> None:
    pack(str(tmp_path / "src"), make_docs(200, 44), {})
    victim = open_dataset(str(tmp_path / "src")).manifest.shards[0].path
    os.remove(tmp_path / "src" / victim)
    ferry = Path(sys.executable).with_name("ferry")
    proc = subprocess.run(
        [str(ferry), "sync", str(tmp_path / "src"), str(tmp_path / "dst"), "--retries", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"FAILED {victim}" in proc.stderr and "NOT published" in proc.stdout
    assert not (tmp_path / "dst" / "manifest.json").exists()


def test_cli_surface_and_exports() -> None:
    """The public face is pinned: a new option or export is a deliberate change."""
    import argparse

    from ferry import service
    from ferry.service.cli import register

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub)
    options = {name: sorted(o for a in p._actions for o in a.option_strings) for name, p in sub.choices.items()}
    expected = ["-h", "--help", "--transfers", "--bwlimit", "--retries", "--verify-only", "--json", "--progress",
                "--no-progress", "--allow-rollback", "--storage-option", "-S", "--src-option",
                "--dst-option", "--log-format", "--engine", "--ray-address"]  # fmt: skip
    assert options["sync"] == sorted(expected)
    assert set(options["serve"]) >= {"--config", "-c", "--log-level", "--log-format", "--drain-timeout"}
    assert sorted(service.__all__) == ["Config", "Daemon", "UNCHANGED", "load_config", "parse_config"]


def test_noop_resync_imports_neither_numpy_nor_pyarrow(tmp_path: Path) -> None:
    """A no-op compares two JSON headers; loading the shard table (numpy, pyarrow) waits for real work."""
    pack(str(tmp_path / "src"), make_docs(40, 7), {})
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    probe = (
        "import sys; from ferry.shard_tools.cli import main; "
        "rc = main(['sync', sys.argv[1], sys.argv[2], '--json', '--no-progress']); "
        "print('HEAVY', sorted(m for m in ('numpy', 'pyarrow') if m in sys.modules), rc, file=sys.stderr)"
    )
    runs = [subprocess.run([sys.executable, "-c", probe, src, dst], capture_output=True, text=True) for _ in range(2)]
    first, again = (r.stderr.strip().splitlines()[-1] for r in runs)
    assert first == "HEAVY ['numpy', 'pyarrow'] 0", runs[0].stderr  # the copy needed the shard table
    assert json.loads(runs[1].stdout)["up_to_date"] is True
    assert again == "HEAVY [] 0", runs[1].stderr


def test_sync_runs_without_pydantic(tmp_path: Path) -> None:
    """`ferry sync` reads no ferry.toml: it works, copy and no-op, where the 'service' extra is absent."""
    pack(str(tmp_path / "src"), make_docs(30, 8), {})
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    probe = (
        "import sys; sys.modules['pydantic'] = None\n"  # any `import pydantic` now fails
        "from ferry.shard_tools.cli import main\n"
        "rc = main()\n"
        "print('RC', rc, file=sys.stderr)"
    )
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", probe, "sync", src, dst, "--json", "--no-progress"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.stderr.strip().splitlines()[-1] == "RC 0", run.stderr
    assert json.loads(run.stdout)["up_to_date"] is True
    assert documents(dst, {}) == documents(src, {})


def test_a_source_that_moves_on_mid_pass_is_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source publishes a newer version, and its retention prunes the one being read, between the
    pass reading manifest.json and the shard table: the sync starts over at the newer version."""
    import ferry.service.replication.engine as engine_module

    src, dst = tmp_path / "src", tmp_path / "dst"
    pack(str(src), make_docs(40, 7), {})
    real_load = engine_module.load_version
    moved: list[str] = []

    def load_after_the_source_moved_on(loc: Any, header: bytes) -> Any:
        if not moved and loc.url.rstrip("/").endswith("src"):
            moved.append(pack(str(src), make_docs(20, 8), {}, append=True).version_id)
            (src / engine_module.parse_header(header)["shard_table"]["path"]).unlink()  # a hub keeping one version
        return real_load(loc, header)

    monkeypatch.setattr(engine_module, "load_version", load_after_the_source_moved_on)
    rc, out, err = run(capsys, str(src), str(dst), "--json", "--no-progress")
    assert rc == 0, err
    assert moved and out["version"] == moved[0] and out["published"], out
    assert open_dataset(str(dst)).manifest.version_id == moved[0]
