"""``ferry state show | skip | diff``: reading states (JSON and DCP), skipping exactly N samples, comparing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scripts.replan_common import Counting, mix, run

from ferry.client import TokenDataset, TokenLoader
from ferry.client.resume.state_cli import main, read_state

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _save(path: Path, state: dict[str, Any]) -> str:
    path.write_text(json.dumps(state))
    return str(path)


def test_the_commands_are_registered_as_ferry_entry_points() -> None:
    root = Path(__file__).resolve().parents[2]
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["ferry.commands"]
    assert eps["state"] == "ferry.client.resume.state_cli:register"
    assert eps["trace"] == "ferry.client.stream.trace:register"
    # what `ferry` does with them (ferry.shard_tools.cli.build_parser): load, register, parse
    import argparse
    import importlib

    parser = argparse.ArgumentParser(prog="ferry")
    sub = parser.add_subparsers(dest="command")
    for name in ("state", "trace"):
        module, func = eps[name].split(":")
        getattr(importlib.import_module(module), func)(sub)
    args = parser.parse_args(["state", "skip", "s.json", "--steps", "3", "--global-batch", "8", "-o", "t.json"])
    assert (args.command, args.state_command, args.steps, args.global_batch) == ("state", "skip", 3, 8)
    assert (
        parser.parse_args(["trace", "--state", "s.json", "--global-batch", "8"]).func.__module__
        == "ferry.client.stream.trace"
    )


def test_show_names_sources_phases_and_where_each_source_stands(tmp_path: Path, capsys: Any) -> None:
    _, s1 = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    _, s2 = run(mix([0, 1, 2], [1, 1, 2]), s1, 2, 2, 2, replan=True)
    assert main(["show", _save(tmp_path / "s.json", s2)]) == 0
    out = capsys.readouterr().out
    assert "global sample 20" in out and "mixture of 3 sources (last re-plan at global sample 12)" in out
    assert "version src2" in out and "read 4 samples of it" in out  # 8 samples at 1:1:2 after the re-plan
    assert "phase from global sample 12: weights 0.25 0.25 0.5" in out
    assert main(["show", "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads(capsys.readouterr().out) == s2


@pytest.mark.parametrize("mixture", [False, True])
def test_skip_skips_exactly_n_samples_of_the_uninterrupted_stream(tmp_path: Path, mixture: bool, capsys: Any) -> None:
    def make() -> Any:
        return mix([0, 1], [2, 1]) if mixture else Counting(0, n=23)

    reference, _ = run(make(), None, 1, 1, 120)
    head, state = run(make(), None, 2, 3, 5)  # 30 samples
    assert main(["skip", _save(tmp_path / "a.json", state), "--samples", "17", "-o", str(tmp_path / "b.json")]) == 0
    skipped = json.loads((tmp_path / "b.json").read_text())
    assert skipped["skips"] == [[state["epoch"], state["consumed"], 17]]
    tail, after = run(make(), skipped, 1, 4, 10)
    assert head + tail == reference[:30] + reference[47:87]  # exactly the 17 after the state are gone
    assert after["skips"] == skipped["skips"] and after["position"] == 87  # and the skip stays on record
    # in steps: 2 steps of a global batch of 6
    assert (
        main(["skip", str(tmp_path / "a.json"), "--steps", "2", "--global-batch", "6", "-o", str(tmp_path / "c.json")])
        == 0
    )
    tail2, _ = run(make(), json.loads((tmp_path / "c.json").read_text()), 3, 1, 2)
    assert tail2 == reference[42:48]
    assert "skips the next 12 samples" in capsys.readouterr().out


def test_skip_of_a_real_dataset_state(tmp_path: Path) -> None:
    from scripts.loader_common import pack_test_dataset

    url = pack_test_dataset(str(tmp_path / "d"), 60, seed=3)
    ds = TokenDataset(url, seq_len=16, seed=1, cache_dir=str(tmp_path / "c"))
    n = ds.num_samples
    loader = TokenLoader(ds, 4, rank=0, world_size=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    del it
    state = loader.state_dict()  # version 1: it knows no epoch length
    assert main(["skip", _save(tmp_path / "a.json", state), "--samples", str(n), "-o", str(tmp_path / "b.json")]) == 0
    resumed = TokenLoader(ds, 4, rank=0, world_size=1)
    resumed.load_state_dict(json.loads((tmp_path / "b.json").read_text()))
    assert resumed.position == 12 + n and resumed.epoch == 1
    np.testing.assert_array_equal(
        next(iter(resumed))["input_ids"].numpy(), ds.batch(np.arange(12 + n, 16 + n))["input_ids"].numpy()
    )


def test_diff_names_what_changed(tmp_path: Path, capsys: Any) -> None:
    _, s1 = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    _, s2 = run(mix([1, 2], [1, 1]), s1, 1, 4, 1, replan=True)
    a, b = _save(tmp_path / "a.json", s1), _save(tmp_path / "b.json", s2)
    assert main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "position: 12 -> 16" in out and "source added: xxh128:" in out and "version src2" in out and "phases:" in out
    assert main(["diff", a, a]) == 0
    assert capsys.readouterr().out == "the states are the same\n"


@pytest.mark.filterwarnings("ignore:torch.distributed is")
def test_a_state_inside_a_dcp_checkpoint_is_read(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    _, s1 = run(mix([0, 1], [1, 1]), None, 1, 4, 3)
    loader = TokenLoader(mix([0, 1, 2], [1, 1, 1]), 2, rank=0, world_size=1)
    loader.load_state_dict(s1, replan=True)
    ckpt = tmp_path / "ckpt"
    dcp.save({"model": {"w": torch.zeros(4)}, "loader": loader}, checkpoint_id=str(ckpt))
    assert read_state(str(ckpt)) == loader.state_dict()
    assert read_state(str(ckpt), "loader") == loader.state_dict()
    # and a later loader loads it from the checkpoint, as DCP does, with its own template
    later = TokenLoader(mix([0, 1, 2], [1, 1, 1]), 3, rank=0, world_size=1)
    dcp.load({"loader": later}, checkpoint_id=str(ckpt))
    assert later.state_dict() == loader.state_dict()


def test_errors_are_one_line(tmp_path: Path, capsys: Any) -> None:
    assert main(["show", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["show", str(tmp_path / "bad.json")]) == 1
    (tmp_path / "odd.json").write_text(json.dumps({"version": 1}))
    assert main(["show", str(tmp_path / "odd.json")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("ferry state: error: ") for line in err)
    with pytest.raises(SystemExit):
        main(["skip", str(tmp_path / "bad.json"), "-o", str(tmp_path / "x.json"), "--samples", "0"])
    assert main(["skip", str(tmp_path / "bad.json"), "-o", str(tmp_path / "x.json")]) == 2


@pytest.mark.filterwarnings("ignore:torch.distributed is")
def test_replan_on_load_matches_the_checkpoints_shape_from_version_1_to_2(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from ferry.client.resume.dcp import ReplanOnLoad

    one, _ = run(Counting(0), None, 1, 5, 2)
    plain = TokenLoader(Counting(0), 5, rank=0, world_size=1)
    plain.load_state_dict(run(Counting(0), None, 1, 5, 2)[1])
    dcp.save({"loader": plain}, checkpoint_id=str(tmp_path / "v1"))  # a version-1 state: 7 keys
    grown = TokenLoader(TokenDataset.mix([Counting(0), Counting(3)], [1, 1]), 2, rank=0, world_size=1)
    dcp.load({"loader": ReplanOnLoad(grown, tmp_path / "v1")}, checkpoint_id=str(tmp_path / "v1"))
    assert grown.position == 10 and grown.state_dict()["plan"]["phases"] == [[0, [1, 0]], [10, [1, 1]]]
    dcp.save({"loader": grown}, checkpoint_id=str(tmp_path / "v2"))
    again = TokenLoader(TokenDataset.mix([Counting(0), Counting(3)], [1, 1]), 4, rank=0, world_size=1)
    dcp.load({"loader": again}, checkpoint_id=str(tmp_path / "v2"))  # same shape: the loader itself loads
    assert again.state_dict() == grown.state_dict() and len(one) == 10
