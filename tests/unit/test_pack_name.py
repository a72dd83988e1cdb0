"""A dataset name holds no control characters: ``ferry pack --name`` refuses one with a usage error
(exit 2) naming the character by its escape, and so does the Python API, before anything is read or
written; names with other characters (spaces, non-ASCII letters) still pack."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.shard_tools import PackOptions, open_dataset, pack_documents
from ferry.shard_tools.cli import main as ferry
from ferry.shard_tools.errors import UsageError
from tests.helpers import EOS, VOCAB, make_docs

BAD = {
    "esc": ("a\x1b[31mred", r"\x1b"),
    "newline": ("two\nlines", r"\n"),
    "nul": ("nul\x00byte", r"\x00"),
    "del": ("del\x7f", r"\x7f"),
    "c1-csi": ("csi\x9b2J", r"\x9b"),
    "line-separator": ("ls\u2028x", r"\u2028"),
    "bidi-override": ("evil\u202egnp.exe", r"\u202e"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_cli_refuses_a_name_with_a_control_character(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, escape = BAD[case]
    src = tmp_path / "in.txt"
    src.write_text("ferry river boat\n" * 20)
    out = tmp_path / "ds"
    code = ferry(["pack", str(src), "--out", str(out), "--lines", "--tokenizer", "bytes", "--name", name])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ferry pack: error: --name "), err
    assert escape in lines[0] and "control character" in lines[0]
    assert name not in err  # the raw character never reaches the terminal
    assert not out.exists()


@pytest.mark.parametrize("case", sorted(BAD))
def test_api_refuses_a_name_with_a_control_character(case: str, tmp_path: Path) -> None:
    name, escape = BAD[case]
    with pytest.raises(UsageError) as caught:
        pack_documents(make_docs(5, seed=1), str(tmp_path / "ds"),
                       PackOptions(vocab_size=VOCAB, eos_id=EOS, name=name, progress=False))  # fmt: skip
    assert escape in str(caught.value)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("name", ["web crawl 2024", "données-été", "ds.v2_final"])
def test_printable_names_still_pack(name: str, tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    pack_documents(make_docs(5, seed=1), url, PackOptions(vocab_size=VOCAB, eos_id=EOS, name=name, progress=False))
    assert open_dataset(url).manifest.name == name
