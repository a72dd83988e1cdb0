"""The data CLI: ferry pack / inspect / verify / export, as users run it (real subprocesses)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ferry.shard_tools import PackOptions, open_dataset, pack_documents
from ferry.shard_tools.cli import main
from ferry.shard_tools.format.megatron import read_index

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]


def ferry(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FERRY, *args], capture_output=True, text=True, timeout=timeout, env=env)


def corpus(tmp_path: Path, files: int = 4, docs: int = 300) -> list[str]:
    rng = np.random.default_rng(42)
    paths = []
    for f in range(files):
        lists = [rng.integers(0, 50_000, size=int(rng.integers(1, 400))).tolist() for _ in range(docs)]
        path = tmp_path / "in" / f"part-{f}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path, row_group_size=64)
        paths.append(str(path))
    return paths


PACK_ARGS = ["--vocab-size", "50257", "--eos-id", "50256", "--shard-size", "64KiB", "--name", "det"]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_workers_1_and_2_byte_identical(tmp_path: Path) -> None:
    inputs = corpus(tmp_path)
    before = tree(tmp_path / "in")
    mtimes = {p: os.stat(p).st_mtime_ns for p in inputs}
    results = {}
    for w in ("1", "2"):
        out = tmp_path / f"w{w}"
        proc = ferry("pack", *inputs, "--out", str(out), *PACK_ARGS, "--workers", w, "--json")
        assert proc.returncode == 0, proc.stderr
        results[w] = json.loads(proc.stdout)
        assert proc.stderr == ""  # no progress bar when stderr is not a TTY
    assert results["1"]["version_id"] == results["2"]["version_id"]
    assert results["1"]["shards"] > 4
    s1, s2 = tree(tmp_path / "w1" / "shards"), tree(tmp_path / "w2" / "shards")
    assert s1 == s2 and len(s1) == results["1"]["shards"]
    v1 = json.loads((tmp_path / "w1" / "manifest.json").read_text())
    v2 = json.loads((tmp_path / "w2" / "manifest.json").read_text())
    assert {k: v for k, v in v1.items() if k != "created_at"} == {k: v for k, v in v2.items() if k != "created_at"}
    # inputs are never modified or deleted
    assert tree(tmp_path / "in") == before
    assert {p: os.stat(p).st_mtime_ns for p in inputs} == mtimes


def test_inspect_verify_export_json(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=2, docs=50)
    out = str(tmp_path / "ds")
    assert ferry("pack", *inputs, "--out", out, *PACK_ARGS).returncode == 0
    info = ferry("inspect", out, "--json", "--shards")
    doc = json.loads(info.stdout)
    assert doc["name"] == "det" and doc["totals"]["documents"] == 100 and len(doc["shards"]) == doc["totals"]["shards"]
    assert doc["versions"] == [doc["version_id"]] and doc["tokenizer"]["eos_id"] == 50256
    human = ferry("inspect", out)
    assert human.returncode == 0 and "100 documents" in human.stdout and doc["version_id"] in human.stdout
    ver = ferry("verify", out, "--json")
    rep = json.loads(ver.stdout)
    assert ver.returncode == 0 and rep["ok"] and rep["checked"] == doc["totals"]["shards"]
    exp = ferry("export", out, "--format", "megatron", "--out", str(tmp_path / "mg"), "--strip-eos", "--json")
    assert exp.returncode == 0, exp.stderr
    assert json.loads(exp.stdout)["documents"] == 100
    index = read_index(str(tmp_path / "mg"))
    assert int(index.lengths.sum()) == doc["totals"]["tokens"] - 100
    first = pq.read_table(inputs[0]).column("tokens")[0].as_py()
    assert np.fromfile(tmp_path / "mg.bin", dtype=np.uint16)[: len(first)].tolist() == first


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["pack", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--out",
        "--tokenizer",
        "--workers",
        "--shard-size",
        "--compression",
        "--append",
        "--json",
        "--executor",
        "--part",
        "--merge",
        "--no-eos",
        "--storage-option",
        "--input-format",
    ):
        assert flag in text


@pytest.mark.parametrize(
    "args, needle",
    [
        (["pack", "x.parquet"], "--out"),
        (["pack", "x.parquet", "--out", "o", "--workers", "two"], "invalid int"),
        (["pack", "x.parquet", "--out", "o", "--vocab-size", "10", "--shard-size", "lots"], "cannot read size"),
        (["pack", "x.parquet", "--out", "o", "--vocab-size", "10", "--compression", "gzip:3"], "only zstd"),
        (["pack", "x.parquet", "--out", "o", "--vocab-size", "10", "--compression", "zstd:99"], "outside 1..22"),
        (["pack", "--out", "o", "--vocab-size", "10"], "no input files"),
        (["pack", "missing.parquet", "--out", "o", "--vocab-size", "10", "--eos-id", "9"], "missing.parquet"),
        (["pack", "x.weird", "--out", "o", "--vocab-size", "10", "--no-eos"], "x.weird"),
        (["pack", "x.parquet", "--out", "o"], "--vocab-size"),
        (["pack", "x.parquet", "--out", "o", "--vocab-size", "10", "--eos-id", "10"], "EOS id 10"),
        (["pack", "x.parquet", "--out", "o", "--vocab-size", "10", "--part", "3/2"], "--part"),
        (["pack", "x.parquet", "--out", "o", "--vocab-size", "10", "--part", "0/2", "--merge"], "--merge"),
        (["pack", "nothing-*.parquet", "--out", "o", "--vocab-size", "10", "--no-eos"], "matches no files"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    assert code == 2
    assert needle in capsys.readouterr().err


def test_missing_dataset_exit_1(tmp_path: Path) -> None:
    proc = ferry("inspect", str(tmp_path / "nothing"))
    assert proc.returncode == 1 and "not a ferry dataset" in proc.stderr and "Traceback" not in proc.stderr


def test_append_mismatch_is_clear(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=1, docs=20)
    out = str(tmp_path / "ds")
    assert ferry("pack", *inputs, "--out", out, *PACK_ARGS).returncode == 0
    proc = ferry("pack", *inputs, "--out", out, "--append", "--vocab-size", "70000", "--eos-id", "1")
    assert proc.returncode == 2
    assert "cannot append" in proc.stderr and "uint16 vs uint32" in proc.stderr
    assert len(open_dataset(out).manifest.shards) >= 1


def test_progress_bar_on_a_tty(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=2, docs=30)
    out = str(tmp_path / "ds")
    pid, fd = pty.fork()
    if pid == 0:  # child: stdout and stderr are the pty
        os.execv(sys.executable, [*FERRY, "pack", *inputs, "--out", out, *PACK_ARGS])
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0
    assert "packing" in text and "2/2" in text and "tok_s" in text and "packed 60 documents" in text


def test_executor_ray_without_ray_is_a_clear_usage_error(tmp_path: Path) -> None:
    inputs = corpus(tmp_path, files=1, docs=5)
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if the 'ray' extra were not installed
        "from ferry.shard_tools.cli import main\n"
        f"sys.exit(main(['pack', {inputs[0]!r}, '--out', {str(tmp_path / 'ds')!r}, '--vocab-size', '50257',"
        " '--eos-id', '50256', '--executor', 'ray']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "pip install 'ferry-data[ray]'" in proc.stderr
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_output_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """`ferry inspect URL | head -1` must not print a BrokenPipeError traceback."""
    out = tmp_path / "ds"
    docs = [list(range(i % 50, i % 50 + 400)) for i in range(1500)]  # ~1 document per 1 KiB shard
    pack_documents(docs, str(out), PackOptions(vocab_size=1000, eos_id=999, shard_size=1024))
    proc = subprocess.run(
        f"{sys.executable} -m shard_tools.cli inspect --shards {out} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.startswith("dataset")
    assert "Traceback" not in proc.stderr
