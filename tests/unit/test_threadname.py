"""ferry's threads carry their names into the OS (what ``top -H``, ``ps -L`` and the load benchmark read)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from conftest import free_port
from helpers import make_docs, pack, wait_until, write_serve_config

from ferry.service.config import load_config
from ferry.service.daemon import Daemon
from ferry.shard_tools import threadname
from ferry.shard_tools.threadname import OS_NAME_BYTES, name_os_thread, start_named_thread

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are read from /proc")


def os_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().rstrip("\n")


def os_names() -> set[str]:
    names = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            names.add(task.joinpath("comm").read_text().rstrip("\n"))
        except FileNotFoundError:  # a thread that ended between the listing and the read
            continue
    return names


@linux_only
@pytest.mark.parametrize(
    ("name", "expected"), [("ferry-copy-3", "ferry-copy-3"), ("ferry-a-name-too-long", "ferry-a-name-to")]
)
def test_a_started_thread_has_its_name_in_the_os(name: str, expected: str) -> None:
    seen: list[str] = []
    release = threading.Event()

    def body(tag: str) -> None:
        seen.append(tag)
        release.wait(10)

    thread = start_named_thread(body, name, ("ran",))
    try:
        assert thread.name == name and thread.daemon
        for _ in range(200):  # the name is set by the thread itself, first thing
            if seen and thread.native_id is not None and os_name(thread.native_id) == expected:
                break
            threading.Event().wait(0.01)
        assert seen == ["ran"] and thread.native_id is not None
        assert os_name(thread.native_id) == expected and len(expected.encode()) <= OS_NAME_BYTES
    finally:
        release.set()
        thread.join(5)


@linux_only
def test_name_os_thread_names_the_calling_thread_from_its_python_name() -> None:
    out: dict[str, object] = {}

    def body() -> None:
        out["ok"] = name_os_thread()
        out["os"] = os_name(threading.get_native_id())

    t = threading.Thread(target=body, name="ferry-prefetch_1")
    t.start()
    t.join(5)
    assert out == {"ok": True, "os": "ferry-prefetch_"}  # 15 bytes kept


def test_elsewhere_naming_is_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threadname.sys, "platform", "darwin")
    assert name_os_thread("ferry-x") is False
    t = start_named_thread(lambda: None, "ferry-x")  # still starts and runs the target
    t.join(5)
    assert not t.is_alive()


@linux_only
def test_the_daemon_and_its_copy_threads_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.service.transfer.copier

    copying: set[str] = set()
    real_copy = ferry.service.transfer.copier.copy_shard

    def recording_copy(*args: object, **kwargs: object) -> object:
        copying.add(os_name(threading.get_native_id()))  # the OS name of the thread doing the copy
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(ferry.service.transfer.copier, "copy_shard", recording_copy)
    pack(str(tmp_path / "src" / "alpha"), make_docs(300, 5), {})
    d = Daemon(load_config(write_serve_config(tmp_path, free_port())))
    q = d.subscribe()
    d.start()
    try:
        # the thread names itself as its first step
        wait_until(lambda: "ferry-daemon" in os_names(), 2, "the daemon thread's OS name", interval=0.01)
        while q.get(timeout=30)["type"] != "pass":
            pass
        assert "ferry-state" in os_names()  # the thread that commits the copies' buffered bookkeeping
    finally:
        d.stop()
    assert copying and all(n.startswith("ferry-copy-") for n in copying), copying
