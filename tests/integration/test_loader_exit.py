"""A training script that ends with its loader open exits at once and prints nothing.

An iterator left open is collected in the interpreter's teardown, where no thread can start (so nothing that
waits for one may run there), and multiprocessing's own exit hook terminates worker processes that DataLoader
still counts as running (its handler then reports each as killed): the loader stops its workers before both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from scripts.loader_common import pack_test_dataset

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "loader_exit.py"
EXIT_S = 60.0  # the interpreter's teardown (torch, pyarrow) on a loaded 2-core machine, with room


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("exit") / "ds"), 200)


@pytest.mark.parametrize("mode", ["open", "epoch", "module"])
def test_a_script_ending_with_its_loader_open_exits_quietly(url: str, tmp_path: Path, mode: str) -> None:
    target = str(tmp_path / "ds") if mode == "module" else url  # that script packs its own
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), target, str(tmp_path / "cache"), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=EXIT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # its stacks, then it goes
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script did not exit within {EXIT_S} s of its start:\n{out}\n{err[-20000:]}")
    assert out.strip() == "returned", out
    assert proc.returncode == 0, err
    assert err.strip() == "", err  # no "Exception ignored ... DataLoader worker killed by signal"
