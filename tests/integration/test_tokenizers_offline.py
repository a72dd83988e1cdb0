"""More tokenizers, all offline: a local tiktoken BPE file (``tiktoken:PATH``) and a Hugging Face
model directory (tokenizer.json + tokenizer_config.json, EOS from the config). Every tokenizer
here is written or trained by the test itself."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ferry.shard_tools import PackOptions, UsageError, open_dataset, pack
from ferry.shard_tools.sources.tokenizer import load_tokenizer

tiktoken = pytest.importorskip(
    "tiktoken", reason="the tiktoken extra is not installed: pip install 'ferry-data[tiktoken]'"
)
tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers extra is not installed")

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
TEXTS = [
    "the fox jumps over the lazy dog",
    "",
    "They're here, don't   panic!\n\nThe end.",
    "1234567 numbers and   trailing spaces   ",
    "über 数据 🦊 mixed scripts\r\nnext line",
    "thethethe other ingoing",
]
MERGES = [b"th", b"the", b" t", b" the", b"in", b"ing", b"er", b" f", b"ox", b" fox", b"12", b"123", b"\n\n"]


@pytest.fixture(autouse=True)
def tiktoken_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tiktoken copies every file it loads into a cache (by default in the system temp directory)."""
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return cache


def bpe_ranks(merges: list[bytes] = MERGES) -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for token in merges:
        ranks[token] = len(ranks)
    return ranks


def write_bpe(path: Path, ranks: dict[bytes, int]) -> Path:
    """The tiktoken BPE format: a base64 token and its rank per line."""
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    return path


def reference(ranks: dict[bytes, int], monkeypatch: pytest.MonkeyPatch) -> Any:
    """cl100k_base's own definition in tiktoken, with this file's ranks in place of the download."""
    import tiktoken_ext.openai_public as public

    monkeypatch.setattr(public, "load_tiktoken_bpe", lambda *a, **k: ranks)
    spec = public.cl100k_base()
    return tiktoken.Encoding("ref", pat_str=spec["pat_str"], mergeable_ranks=spec["mergeable_ranks"], special_tokens={})


def read_back(url: str) -> list[list[int]]:
    return [d.tolist() for d in open_dataset(url).documents()]


def jsonl(path: Path, texts: list[str] = TEXTS) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


# --- tiktoken BPE files ---


def test_tiktoken_file_encodes_as_tiktoken_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = bpe_ranks()
    bpe = write_bpe(tmp_path / "tiny.tiktoken", ranks)
    tok = load_tokenizer(f"tiktoken:{bpe}")
    ref = reference(ranks, monkeypatch)
    assert [t.tolist() for t in tok.encode_batch(TEXTS)] == [ref.encode_ordinary(t) for t in TEXTS]
    assert tok.info.name == "tiktoken:tiny.tiktoken" and tok.info.vocab_size == len(ranks) and tok.info.eos_id is None
    assert any(len(ref.decode_single_token_bytes(i)) > 1 for t in TEXTS for i in ref.encode_ordinary(t))  # merges used


def test_tiktoken_pack_round_trip_and_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = bpe_ranks()
    bpe = write_bpe(tmp_path / "tiny.tiktoken", ranks)
    inputs = [jsonl(tmp_path / "a.jsonl"), jsonl(tmp_path / "b.jsonl", TEXTS[::-1] * 40)]
    eos, vocab = len(ranks), len(ranks) + 1  # EOS is a special token past the ranks
    versions = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        args = ["pack", *inputs, "--out", str(out), "--tokenizer", f"tiktoken:{bpe}", "--eos-id", str(eos)]
        args += ["--vocab-size", str(vocab), "--shard-size", "2KiB", "--name", "tt", "--workers", workers, "--json"]
        proc = subprocess.run([*FERRY, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        versions.append(json.loads(proc.stdout)["version_id"])
    assert versions[0] == versions[1]
    ref = reference(ranks, monkeypatch)
    assert read_back(str(tmp_path / "w2")) == [ref.encode_ordinary(t) for t in TEXTS + TEXTS[::-1] * 40]
    m = open_dataset(str(tmp_path / "w2")).manifest
    assert (m.tokenizer.name, m.tokenizer.vocab_size, m.tokenizer.eos_id) == ("tiktoken:tiny.tiktoken", vocab, eos)
    with pytest.raises(UsageError, match=f"EOS id {eos} is not below the vocabulary size {eos}"):
        pack(inputs, str(tmp_path / "x"), PackOptions(tokenizer=f"tiktoken:{bpe}", eos_id=eos))


def test_tiktoken_file_changed_in_place_is_reread(tmp_path: Path, tiktoken_cache: Path) -> None:
    # tiktoken caches by path: a BPE file edited in place must not be served from the stale copy
    bpe = tmp_path / "edited.tiktoken"
    write_bpe(bpe, bpe_ranks([]))
    assert load_tokenizer(f"tiktoken:{bpe}").encode_batch(["the"])[0].tolist() == list(b"the")
    write_bpe(bpe, bpe_ranks([b"th", b"the"]))
    tok = load_tokenizer(f"tiktoken:{bpe}")
    assert tok.encode_batch(["the"])[0].tolist() == [257] and tok.info.vocab_size == 258
    assert any(tiktoken_cache.iterdir())  # the cache was in play


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "has no tokens"),
        (b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(255)), "no token for byte 0xff"),
        (b"".join(base64.b64encode(bytes([b])) + b" %d\n" % (b % 200) for b in range(256)), "same rank"),
        (b"not-a-line\n", "Error parsing line"),
        (b"".join(base64.b64encode(bytes([b])) + b" %d\n" % (b - 1) for b in range(256)), "rank -1"),
    ],
)
def test_bad_tiktoken_files_are_usage_errors(tmp_path: Path, content: bytes, needle: str) -> None:
    # each of these would make tiktoken panic (a Rust panic, not an exception) or fail to load
    bpe = tmp_path / "bad.tiktoken"
    bpe.write_bytes(content)
    with pytest.raises(UsageError, match="bad.tiktoken") as info:
        load_tokenizer(f"tiktoken:{bpe}")
    assert needle in str(info.value)


def test_tiktoken_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="local BPE file"):
        load_tokenizer("tiktoken:https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken")
    with pytest.raises(UsageError, match="local BPE file"):
        load_tokenizer("tiktoken:")
    with pytest.raises(UsageError, match="missing.tiktoken"):
        load_tokenizer(f"tiktoken:{tmp_path / 'missing.tiktoken'}")
    with pytest.raises(UsageError, match="--eos-id"):
        load_tokenizer(f"tiktoken:{write_bpe(tmp_path / 't.tiktoken', bpe_ranks())}", eos_token="<|endoftext|>")


# --- Hugging Face model directories ---


def model_dir(root: Path, config: Any) -> Path:
    """A model directory: a trained BPE tokenizer.json and a tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "</s>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS * 10, trainer)
    root.mkdir(parents=True)
    tok.save(str(root / "tokenizer.json"))
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (root / "tokenizer_config.json").write_text(text)
    return root


@pytest.mark.parametrize(
    "eos_token",
    ["<|im_end|>", {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "special": True}],
)
def test_model_dir_takes_eos_from_its_config(tmp_path: Path, eos_token: Any) -> None:
    from tokenizers import Tokenizer

    root = model_dir(tmp_path / "my-model", {"eos_token": eos_token, "bos_token": "<unk>", "model_max_length": 8})
    hf = Tokenizer.from_file(str(root / "tokenizer.json"))
    out = str(tmp_path / "out")
    pack([jsonl(tmp_path / "in.jsonl")], out, PackOptions(tokenizer=f"{root}/", shard_size=2048))
    m = open_dataset(out).manifest
    # the config's EOS, not the "</s>" a bare tokenizer.json would be guessed to use
    assert m.tokenizer.eos_id == hf.token_to_id("<|im_end|>") != hf.token_to_id("</s>")
    assert (m.tokenizer.name, m.tokenizer.vocab_size) == ("my-model", hf.get_vocab_size())
    assert read_back(out) == [hf.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert load_tokenizer(str(root), eos_token="</s>").info.eos_id == hf.token_to_id("</s>")  # --eos-token wins


def test_model_dir_cli_workers(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m", {"eos_token": "</s>"})
    inputs = [jsonl(tmp_path / "in.jsonl", TEXTS * 50), jsonl(tmp_path / "in2.jsonl", TEXTS[::-1] * 50)]
    versions = []
    for workers in ("1", "2"):
        args = ["pack", *inputs, "--out", str(tmp_path / f"w{workers}"), "--tokenizer", str(root), "--name", "m"]
        proc = subprocess.run(
            [*FERRY, *args, "--shard-size", "2KiB", "--workers", workers, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        versions.append(json.loads(proc.stdout)["version_id"])
    assert versions[0] == versions[1]


def test_model_dir_errors(tmp_path: Path) -> None:
    no_config = model_dir(tmp_path / "no-config", None)
    with pytest.raises(UsageError, match=r"no-config/tokenizer_config\.json is missing"):
        load_tokenizer(str(no_config))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"empty/tokenizer\.json is missing"):
        load_tokenizer(str(tmp_path / "empty"))
    unknown = model_dir(tmp_path / "unknown", {"eos_token": "<|eot_id|>"})
    with pytest.raises(UsageError, match=r"tokenizer_config\.json: eos_token '<\|eot_id\|>' is not in the vocabulary"):
        load_tokenizer(str(unknown))
    broken = model_dir(tmp_path / "broken", "{not json")
    with pytest.raises(UsageError, match=r"cannot read .*broken/tokenizer_config\.json"):
        load_tokenizer(str(broken))
    odd = model_dir(tmp_path / "odd", {"eos_token": 2})
    with pytest.raises(UsageError, match=r"eos_token is 2"):
        load_tokenizer(str(odd))
    (tmp_path / "bad-json").mkdir()
    (tmp_path / "bad-json" / "tokenizer.json").write_text("{}")
    (tmp_path / "bad-json" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UsageError, match=r"cannot load tokenizer .*bad-json/tokenizer\.json"):
        load_tokenizer(str(tmp_path / "bad-json"))


def test_model_dir_without_eos_needs_eos_id(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m", {"eos_token": None})
    assert load_tokenizer(str(root)).info.eos_id is None  # no guess when the config says none
    with pytest.raises(UsageError, match="--eos-id"):
        pack([jsonl(tmp_path / "in.jsonl")], str(tmp_path / "out"), PackOptions(tokenizer=str(root)))
    pack([jsonl(tmp_path / "in.jsonl")], str(tmp_path / "out"), PackOptions(tokenizer=str(root), append_eos=False))
