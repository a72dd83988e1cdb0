"""Operator commands believe nothing: hostile options and files end in one-line errors, never a
traceback or made-up output, and inspecting a checkpoint never runs code from it.

``ferry trace`` checks its step, rank and batch with the same checks ``TokenLoader.trace`` uses;
mixing weights are checked once (``ferry.client.sampling.mixing.check_weights``) for ``MixedDataset`` and the
schedule; ``ferry state`` reads a ``torch.distributed.checkpoint`` with an unpickler that builds
only DCP's metadata classes and plain values unless ``--trust-pickle`` is given.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scripts.replan_common import Counting, mix, run

from ferry.client import TokenDataset, TokenLoader
from ferry.client.resume.state_cli import main as state_main
from ferry.client.resume.state_cli import read_state
from ferry.client.sampling.mixing import MixSchedule
from ferry.client.stream.trace import main as trace_main
from ferry.client.stream.trace import step_positions, trace_positions
from ferry.shard_tools.cli import main as ferry
from ferry.shard_tools.errors import InvalidValueError, StateError, UsageError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("ops")
    src = root / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "ferry river boat " * (i % 9 + 1)}) + "\n" for i in range(80)))
    url = str(root / "ds")
    assert ferry(["pack", str(src), "--out", url, "--tokenizer", "bytes", "--shard-size", "4KiB"]) == 0
    return url, str(root / "cache")


def _one_error_line(err: str, command: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ferry {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --- ferry trace ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--step", "-3"], "--step must be an integer in [0, 2**62), got -3"),
        (["--step", "0", "--rank", "-1", "--batch-size", "2"], "--rank must be an integer in [0, 2), got -1"),
        (["--step", "0", "--rank", "2", "--batch-size", "2"], "--rank must be an integer in [0, 2), got 2"),
        (["--step", "0", "--rank", "0", "--batch-size", "3"], "--batch-size 3 does not divide --global-batch 4"),
        (["--step", "0", "--rank", "0", "--batch-size", "0"], "--batch-size must be an integer in [1, 5), got 0"),
        (["--step", "0", "--batch-size", "2"], "--batch-size goes with --rank"),
        (["--step", "0", "--rank", "0"], "--rank needs --batch-size"),
        (["--step", str(2**62)], "--step must be an integer in [0, 2**62)"),
        (["--step", str(2**63)], "--step must be an integer in [0, 2**62)"),
        (["--step", str(2**60)], "is beyond the last stream position"),
        (["--step", "0", "--weights", "3"], "--weights mixes two or more --data datasets"),
    ],
)
def test_trace_refuses_hostile_steps_and_ranks(
    dataset: tuple[str, str], extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, cache = dataset
    args = ["--data", url, "--seed", "0", "--seq-len", "16", "--global-batch", "4", "--cache-dir", cache, *extra]
    assert trace_main(args) == 2
    captured = capsys.readouterr()
    assert message in _one_error_line(captured.err, "trace") and captured.out == ""


@pytest.mark.parametrize("g", ["0", "-4", str(2**31)])
def test_trace_refuses_an_empty_or_huge_global_batch(
    dataset: tuple[str, str], g: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, cache = dataset
    args = ["--data", url, "--seed", "0", "--seq-len", "16", "--global-batch", g, "--step", "0", "--cache-dir", cache]
    assert trace_main(args) == 2
    captured = capsys.readouterr()
    assert "--global-batch must be an integer in [1, 2**31)" in _one_error_line(captured.err, "trace")
    assert captured.out == ""


@pytest.mark.parametrize("weights", [["nan", "1"], ["inf", "1"], ["-1", "1"], ["0", "1"], ["1e300", "1"]])
def test_trace_refuses_hostile_weights(
    dataset: tuple[str, str], weights: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, cache = dataset
    args = ["--data", url, "--data", url, "--weights", *weights, "--seed", "0", "--seq-len", "16"]
    assert trace_main([*args, "--global-batch", "4", "--step", "0", "--cache-dir", cache]) == 2
    assert "weights" in _one_error_line(capsys.readouterr().err, "trace")


def test_trace_at_the_last_step_that_fits_names_real_positions(dataset: tuple[str, str], capsys: Any) -> None:
    url, cache = dataset
    last = 2**62 // 4 - 1
    args = ["--data", url, "--data", url, "--weights", "1", "2", "--seed", "0", "--seq-len", "16", "--json"]
    assert trace_main([*args, "--global-batch", "4", "--step", str(last), "--cache-dir", cache]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["position"] for r in records] == [2**62 - 4, 2**62 - 3, 2**62 - 2, 2**62 - 1]
    assert all(r["documents"] and r["sample"] >= 0 for r in records)


def test_the_cli_and_the_python_api_share_one_check(dataset: tuple[str, str]) -> None:
    url, cache = dataset
    loader = TokenLoader(TokenDataset(url, seq_len=16, seed=0, cache_dir=cache), 2, rank=0, world_size=1)
    for step in (-3, 2**62, True):
        with pytest.raises(UsageError, match="step must be an integer"):
            loader.trace(step=step)
        with pytest.raises(UsageError, match="step must be an integer"):
            step_positions(step, 4)
    for positions in ([-1], [2**62], [2**63], [1.5], [True], "0"):
        with pytest.raises(UsageError, match="positions"):
            loader.trace(positions)
    with pytest.raises(UsageError, match="positions"):
        trace_positions(loader.dataset, np.asarray([-5]))
    assert [r["position"] for r in loader.trace([0, 2**62 - 1])] == [0, 2**62 - 1]
    with pytest.raises(UsageError, match=r"positions must lie in \[0, 2\*\*62\)"):
        TokenLoader(loader.dataset, 4, rank=0, world_size=1).trace(step=2**61)  # its batch starts at 2**63


# --- mixing weights ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [2**80, 10**400, True, math.nan, math.inf, -1.0, 0, np.float64("nan"), "1", None])
def test_mixing_weights_are_finite_positive_reals_below_2_63(bad: Any) -> None:
    with pytest.raises(InvalidValueError, match="mixing weights") as info:
        mix([0, 1], [bad, 1])
    assert isinstance(info.value, ValueError) and isinstance(info.value, UsageError)
    with pytest.raises(ValueError, match="mixing weights"):
        MixSchedule([bad, 1])


def test_large_equal_weights_still_mix_exactly() -> None:
    assert MixSchedule([2**62, 2**62]).quota.tolist() == [1, 1]
    numpy_weights: list[Any] = [np.int64(3), np.float32(1.0)]
    assert MixSchedule(numpy_weights).quota.tolist() == [3, 1]
    with pytest.raises(ValueError, match="differ by more than"):
        MixSchedule([2**62, 1])


# --- ferry state: checkpoints that run code ------------------------------------------------------------------------


class _Marker:
    """Unpickling this opens (so creates) ``path``: what a crafted checkpoint would do, harmlessly."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _dcp_with_state(path: Path, state: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.zeros(2)}, "loader": state}, checkpoint_id=str(path))


@pytest.mark.filterwarnings("ignore:torch.distributed is")
def test_state_show_does_not_unpickle_a_crafted_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, state = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    ckpt = tmp_path / "ckpt"
    _dcp_with_state(ckpt, state)
    marker = tmp_path / "ran"
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Marker(str(marker))))
    assert state_main(["show", str(ckpt)]) == 1
    line = _one_error_line(capsys.readouterr().err, "state")
    assert "it names io.open" in line and "--trust-pickle" in line
    assert not marker.exists()
    with pytest.raises(StateError):
        read_state(str(ckpt))
    assert trace_main(["--state", str(ckpt), "--global-batch", "4"]) == 1  # ferry trace reads it the same way
    assert not marker.exists()
    # the flag does what it says, loudly: torch's unpickler runs the file's code
    assert state_main(["show", str(ckpt), "--trust-pickle"]) == 1
    err = capsys.readouterr().err
    assert "--trust-pickle: unpickling" in err and "runs code" in err and marker.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is")
def test_a_crafted_value_in_a_checkpoint_is_not_unpickled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, state = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    marker = tmp_path / "ran"
    ckpt = tmp_path / "ckpt"
    _dcp_with_state(ckpt, {**state, "seed": _Marker(str(marker))})  # a legitimate metadata, a hostile value
    assert not marker.exists()
    assert state_main(["show", str(ckpt)]) == 1
    assert "is not a plain value" in _one_error_line(capsys.readouterr().err, "state")
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is")
def test_a_real_checkpoint_reads_without_trusting_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, state = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    ckpt = tmp_path / "ckpt"
    _dcp_with_state(ckpt, state)
    assert read_state(str(ckpt)) == state == read_state(str(ckpt), "loader", trust_pickle=True)
    assert state_main(["show", str(ckpt)]) == 0
    assert "global sample 12" in capsys.readouterr().out
    (ckpt / ".metadata").write_bytes(b"\x80\x05garbage")
    assert state_main(["show", str(ckpt)]) == 1
    _one_error_line(capsys.readouterr().err, "state")
    (ckpt / ".metadata").unlink()
    assert state_main(["show", str(ckpt)]) == 2
    assert "not a torch.distributed.checkpoint" in _one_error_line(capsys.readouterr().err, "state")


# --- ferry state skip -o ---------------------------------------------------------------------------------------------


def _state_file(tmp_path: Path) -> str:
    _, state = run(Counting(0), None, 1, 4, 3)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(state))
    return str(path)


@pytest.mark.parametrize("where", ["missing/x.json", "file/x.json", "adir", ""])
def test_skip_to_an_unwritable_place_is_one_line(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _state_file(tmp_path)
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "adir").mkdir()
    out = str(tmp_path / where) if where else ""
    assert state_main(["skip", src, "--samples", "3", "-o", out]) == 2
    _one_error_line(capsys.readouterr().err, "state")
    assert sorted(os.listdir(tmp_path)) == ["adir", "file", "s.json"]  # no temp file left behind


def test_skip_replaces_its_output_atomically_and_never_writes_through_a_symlink(tmp_path: Path) -> None:
    src = _state_file(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "out.json").symlink_to(victim)
    assert state_main(["skip", src, "--samples", "3", "-o", str(tmp_path / "out.json")]) == 0
    assert victim.read_text() == "keep me" and not (tmp_path / "out.json").is_symlink()
    assert json.loads((tmp_path / "out.json").read_text())["skips"][-1][2] == 3
    assert state_main(["skip", src, "--samples", "5", "-o", str(tmp_path / "out.json")]) == 0  # an existing file
    assert json.loads((tmp_path / "out.json").read_text())["skips"][-1][2] == 5
    assert sorted(os.listdir(tmp_path)) == ["out.json", "s.json", "victim.txt"]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--samples", str(2**63)], 1),
        (["--steps", str(2**40), "--global-batch", str(2**40)], 1),
        (["--samples", "-1"], 2),
        (["--samples", "nan"], 2),
        (["--samples", "0"], 2),
        (["--steps", "3"], 2),
    ],
)
def test_skip_refuses_hostile_counts(tmp_path: Path, args: list[str], code: int, capsys: Any) -> None:
    src = _state_file(tmp_path)
    try:
        rc = state_main(["skip", src, *args, "-o", str(tmp_path / "o.json")])
    except SystemExit as exc:  # argparse: its usage line and one error line, exit 2
        rc = int(exc.code or 0)
    assert rc == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "o.json").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is")
def test_a_checkpoint_entry_pointing_outside_its_directory_is_refused(tmp_path: Path) -> None:
    _, state = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    ckpt = tmp_path / "ckpt"
    _dcp_with_state(ckpt, state)
    md = pickle.loads((ckpt / ".metadata").read_bytes())  # a checkpoint we wrote: trusted here
    for index, info in md.storage_data.items():
        if index.fqn.startswith("loader."):
            md.storage_data[index] = type(info)("../outside.distcp", info.offset, info.length)
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(StateError, match="storage record ferry does not read"):
        read_state(str(ckpt))


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_state_files_that_are_not_files_are_refused_without_reading(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ferry.client.resume.state_cli import MAX_STATE_BYTES

    path = tmp_path / "s.json"
    if kind == "fifo":
        os.mkfifo(path)  # opening it would wait for a writer forever
    elif kind == "device":
        path = Path("/dev/zero")  # reading it would never end
    else:
        with open(path, "wb") as f:
            f.truncate(MAX_STATE_BYTES + 1)  # sparse: no disk used
    assert state_main(["show", str(path)]) in (1, 2)
    _one_error_line(capsys.readouterr().err, "state")


def test_trace_refuses_flags_that_contradict_the_state(
    dataset: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, cache = dataset
    single = TokenLoader(TokenDataset(url, seq_len=16, seed=5, cache_dir=cache), 2, rank=0, world_size=1)
    (tmp_path / "single.json").write_text(json.dumps(single.state_dict()))
    mixed_ds = TokenDataset.mix([TokenDataset(url, seq_len=16, seed=5, cache_dir=cache)] * 2, [1, 1])
    mixed = TokenLoader(mixed_ds, 2, rank=0, world_size=1)
    (tmp_path / "mixed.json").write_text(json.dumps(mixed.state_dict()))
    common = ["--global-batch", "4", "--cache-dir", cache]
    cases = [
        (["--state", str(tmp_path / "single.json"), "--data", url, "--seed", "6"], "--seed 6 contradicts"),
        (["--state", str(tmp_path / "single.json"), "--data", url, "--seq-len", "8"], "--seq-len 8 contradicts"),
        (["--state", str(tmp_path / "mixed.json"), "--weights", "1", "2"], "drop --weights"),
    ]
    for args, message in cases:
        assert trace_main([*args, *common]) == 2
        captured = capsys.readouterr()
        assert message in _one_error_line(captured.err, "trace") and captured.out == ""
    assert trace_main(["--state", str(tmp_path / "single.json"), "--data", url, "--seed", "5", *common]) == 0
    assert trace_main(["--state", str(tmp_path / "mixed.json"), *common]) == 0


def test_state_show_and_diff_escape_hostile_strings_in_a_state(tmp_path: Path, capsysbinary: Any) -> None:
    _, state = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    hostile = json.loads(json.dumps(state))
    hostile["plan"]["sources"][0][1] = "s3://b/x\x1b]0;t\x07\nposition: FORGED\u202e\x9b"  # [key, url, identity, eras]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(state))
    b.write_text(json.dumps(hostile))
    assert state_main(["show", str(b)]) == 0
    assert state_main(["diff", str(a), str(b)]) in (0, 1)
    out = capsysbinary.readouterr().out
    assert b"\x1b" not in out and b"\x07" not in out and "\u202e".encode() not in out and b"\xc2\x9b" not in out
    assert not any(line.startswith(b"position: FORGED") for line in out.splitlines())
    assert b"x\\x1b]0;t\\x07\\nposition: FORGED\\u202e\\x9b" in out
