"""The dashboard in real headless Chromium (Playwright) against a real daemon replicating east → west.

Screenshots go to ``test-artifacts/`` (git-ignored).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from configs import Link, Swarm
from helpers import TOKEN, pack, running_service, wait_until

from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.storage.store import resolve

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
    reason="Chromium is not installed (/usr/bin/chromium); `make browser` installs Debian's package",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"), args=ARGS
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def _shot(pg, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def _cell(pg, dataset: str, cluster: str):  # type: ignore[no-untyped-def]
    return pg.locator(f'#matrix tr[data-dataset="{dataset}"] td[data-cluster="{cluster}"]')


# Installed in the page: notes each distinct (state, percent) the corpus/west cell is rendered with,
# and whether the transfers table ever listed a row. Each render replaces the matrix's cells, and a
# MutationObserver sees every one (state and percent read together, from the same element).
_RECORD_RENDERS = """() => {
  window.__cellRenders = []; window.__sawTransfer = false; window.__done = false;
  const note = () => {
    const td = document.querySelector('#matrix tr[data-dataset="corpus"] td[data-cluster="west"]');
    if (td) {
      const now = [td.dataset.state, parseFloat(td.dataset.percent)];
      const last = window.__cellRenders[window.__cellRenders.length - 1];
      if (!last || last[0] !== now[0] || last[1] !== now[1]) window.__cellRenders.push(now);
      if (now[0] === "complete") window.__done = true;
    }
    if (document.querySelector("#transfers tbody tr")) window.__sawTransfer = true;
  };
  new MutationObserver(note).observe(document.body, { childList: true, subtree: true });
}"""


def _what_the_daemon_says(svc) -> str:  # type: ignore[no-untyped-def]
    """The daemon's own view and its threads' stacks, for a sync that did not end in time."""
    frames = sys._current_frames()
    stacks = [
        f"{t.name}: "
        + " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(traceback.extract_stack(frames[t.ident])[-6:]))
        for t in threading.enumerate()
        if t.ident in frames and t.name.startswith("ferry")
    ]
    return (
        f"matrix {svc.daemon.replica_matrix()}; transfers {svc.daemon.transfers()}; "
        f"errors {svc.daemon.errors()}; threads {stacks}"
    )


def test_matrix_and_transfers_update_live_without_reload(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    with running_service(tmp_path, monkeypatch, bwlimit="48KiB/s") as svc:
        page.goto(svc.url + "/")
        page.wait_for_selector("#conn.pill-ok", timeout=15_000)  # the event stream is live
        page.evaluate("window.__sameDocument = true")
        assert page.locator("#matrix-empty").is_visible()

        page.evaluate(_RECORD_RENDERS)  # every render, seen in the page: a poll from here misses some under load
        res = pack(svc.east("corpus"), 400, shard_size=16384)  # ~20 shards, several seconds at the limit
        shot_mid = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not page.evaluate("window.__done"):
            if not shot_mid and page.evaluate("window.__sawTransfer"):
                _shot(page, "syncing")
                shot_mid = True
            time.sleep(0.1)
        renders = [(str(st), float(pct)) for st, pct in page.evaluate("window.__cellRenders")]
        assert renders and renders[-1] == ("complete", 100.0), (renders[-5:], _what_the_daemon_says(svc))
        partial = {pct for _, pct in renders if 0 < pct < 100}
        assert len(partial) >= 2, f"the matrix should move through partial states live: {renders}"
        assert page.evaluate("window.__sawTransfer"), "a transfer in flight should have been listed"
        assert page.evaluate("window.__sameDocument") is True  # no reload happened
        assert _cell(page, "corpus", "east").get_attribute("data-state") == "source"
        assert "100%" in _cell(page, "corpus", "west").inner_text()
        wait_until(lambda: svc.west_version("corpus") == res.version_id, what="publication")
        page.wait_for_function("document.querySelectorAll('#transfers tbody tr').length === 0", timeout=10_000)
        page.wait_for_function(
            "!document.querySelector('#chart-desc').textContent.startsWith('now 0 B/s · peak 0 B/s')", timeout=15_000
        )
        assert page.locator("#links tbody tr").first.inner_text().startswith("east → west")
        # the link's egress for the version: every shard's stored bytes, the version named beside them
        stored = sum(s.stored_bytes for s in load_manifest(resolve(svc.east("corpus"))).shards)
        page.wait_for_function(f"document.querySelector('#links td[data-egress]')?.dataset.egress === '{stored}'",
                               timeout=15_000)  # fmt: skip
        assert res.version_id[:10] in page.locator("#links td[data-egress]").first.inner_text()
        _shot(page, "complete")


def test_links_show_the_routed_plans_rate(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    links = [Link("east", "west", capacity="10MiB/s")]
    with running_service(tmp_path, monkeypatch, links=links, swarm=Swarm(enabled=True, routed=True)) as svc:
        page.goto(svc.url + "/")
        page.wait_for_selector("#conn.pill-ok", timeout=15_000)
        res = pack(svc.east("corpus"), 40)
        wait_until(lambda: svc.west_version("corpus") == res.version_id, what="publication")
        page.wait_for_function(
            f"document.querySelector('#links td[data-planned]')?.dataset.planned === '{10 * 2**20}'", timeout=15_000
        )
        assert "10.0 MiB/s planned" in page.locator("#links td[data-planned]").inner_text()


def test_failure_shows_and_retry_with_token_clears_it(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    with running_service(tmp_path, monkeypatch) as svc:
        page.goto(svc.url + "/")
        page.wait_for_selector("#conn.pill-ok", timeout=15_000)
        res = pack(svc.east("corpus"))
        shards = sorted((Path(svc.east("corpus")) / "shards").iterdir())
        victim = shards[0]
        good = victim.read_bytes()
        victim.write_bytes(good[:-32] + bytes(32))  # injected failure: the copy's digest check must refuse it

        row = page.locator("#errors tbody tr").first
        row.wait_for(timeout=30_000)
        assert victim.name.split(".")[0][:8] in row.inner_text()
        assert page.locator("#errors tbody tr td.reason").first.inner_text().strip() != ""
        page.wait_for_selector('#matrix td[data-cluster="west"][data-state="failed"]', timeout=10_000)
        _shot(page, "error")

        victim.write_bytes(good)
        row.locator("button.retry").click()
        dialog = page.locator("#token-dialog")
        dialog.wait_for(state="visible")
        page.fill("#token-input", "wrong-token")
        page.keyboard.press("Enter")
        page.wait_for_selector("#token-why:has-text('refused')", timeout=10_000)  # asked again
        page.fill("#token-input", TOKEN)
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelectorAll('#errors tbody tr').length === 0", timeout=30_000)
        page.wait_for_selector('#matrix td[data-cluster="west"][data-state="complete"]', timeout=30_000)
        assert svc.client.errors() == []
        assert svc.west_version("corpus") == res.version_id


def test_pause_and_resume_by_keyboard(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    with running_service(tmp_path, monkeypatch) as svc:
        page.goto(svc.url + "/")
        page.wait_for_selector("#conn.pill-ok", timeout=15_000)
        page.focus("#btn-pause")
        page.keyboard.press("Enter")
        page.wait_for_selector("#token-dialog[open]")
        page.keyboard.type(TOKEN)
        page.keyboard.press("Enter")
        page.wait_for_selector("#state:has-text('paused')", timeout=10_000)
        assert page.inner_text("#btn-pause") == "Resume"
        assert svc.daemon.paused is True

        # paused: a new dataset is planned but nothing copies
        pack(svc.east("corpus"))
        page.wait_for_selector('#matrix tr[data-dataset="corpus"]', timeout=15_000)
        time.sleep(1.0)
        assert svc.client.replicas().cell("corpus", "west").verified_shards == 0  # type: ignore[union-attr]
        _shot(page, "paused")

        page.focus("#btn-pause")
        page.keyboard.press("Enter")  # the token is remembered for this tab
        page.wait_for_selector("#btn-pause:has-text('Pause')", timeout=10_000)
        assert svc.daemon.paused is False
        page.wait_for_selector('#matrix td[data-cluster="west"][data-state="complete"]', timeout=30_000)

        # the bandwidth dialog sets a global limit
        page.click("#btn-limits")
        page.fill("#lim-global", "3")
        page.keyboard.press("Enter")
        wait_until(lambda: svc.daemon.limits().global_bps == 3 * 2**20, timeout=10, what="the new limit")
        page.wait_for_selector("#sum-limit:has-text('3.00 MiB/s')", timeout=10_000)


def test_read_protected_service_asks_for_the_token_first(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    with running_service(tmp_path, monkeypatch, read_protected=True) as svc:
        res = pack(svc.east("corpus"))
        wait_until(lambda: svc.west_version("corpus") == res.version_id, what="replication")
        page.goto(svc.url + "/")
        page.wait_for_selector("#token-dialog[open]", timeout=15_000)
        assert page.locator("#matrix tbody tr").count() == 0  # nothing shown before the token
        page.fill("#token-input", TOKEN)
        page.keyboard.press("Enter")
        page.wait_for_selector('#matrix td[data-cluster="west"][data-state="complete"]', timeout=15_000)
        page.wait_for_selector("#conn.pill-ok", timeout=15_000)  # the event stream carries the token too
        assert TOKEN not in page.content()


def test_another_writer_is_shown_until_its_lease_ends(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from ferry.service.replication.lease import Lease
    from ferry.shard_tools.storage.store import resolve

    with running_service(tmp_path, monkeypatch) as svc:
        page.goto(svc.url + "/")
        page.wait_for_selector("#conn.pill-ok", timeout=15_000)
        assert page.locator("#writers").is_hidden()
        other = Lease(resolve(svc.west("corpus")), "sync")
        other.acquire()
        try:
            pack(svc.east("corpus"))
            page.wait_for_selector("#writers:not([hidden])", timeout=30_000)
            text = page.locator("#writers-list").inner_text()
            assert "corpus at west" in text and other.holder in text
            _shot(page, "other-writer")
        finally:
            other.release()
        page.wait_for_selector("#writers[hidden]", state="attached", timeout=30_000)
        page.wait_for_selector('#matrix td[data-cluster="west"][data-state="complete"]', timeout=30_000)


def test_the_jobs_panel_shows_a_real_loader(page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A loader process registered with the daemon: its row names the job, dataset @ version, the replica
    (cluster) it reads, its position and stall share (flagged over 5%), and what staging holds ahead of it."""
    import os
    import subprocess

    from configs import Staging

    staging = Staging(str(tmp_path / "staging"), "4MiB", "256KiB", interval=0.1)
    with running_service(tmp_path, monkeypatch, staging=staging) as svc:
        res = pack(svc.east("corpus"), 200)
        wait_until(lambda: svc.west_version("corpus") == res.version_id, what="publication")
        script = Path(__file__).resolve().parents[1] / "scripts" / "job_loader.py"
        env = {**os.environ, "FERRY_SERVICE_URL": svc.url, "FERRY_API_TOKEN": TOKEN, "FERRY_JOB_NAME": "llama-run",
               "FERRY_JOB_HEARTBEAT": "0.2"}  # fmt: skip
        urls = f"{tmp_path / 'staging' / 'corpus'},{svc.west('corpus')}"
        cmd = [sys.executable, str(script), urls, str(tmp_path / "cache"), str(tmp_path / "progress"), "100000", "0.01"]
        loader = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            page.goto(svc.url + "/")
            row = page.locator("#jobs tbody tr").first
            page.wait_for_function(  # registered, moving, and staged for
                "(() => { const r = document.querySelector('#jobs tbody tr');"
                " return r && !r.cells[3].textContent.startsWith('0 ') && r.cells[6].textContent !== '—'; })()",
                timeout=60_000,
            )
            cells = [row.locator("td").nth(i).inner_text() for i in range(8)]
            assert cells[0] == "llama-run rank 0/1"
            assert cells[1] == f"corpus @ {res.version_id[:10]}"
            assert cells[2] in ("west", urls.split(",")[0])  # the replica read most: west, or staging once ahead
            (job,) = svc.client.jobs()
            share = job.stats.stall_share
            flagged = row.locator("td").nth(5).locator(".sla.miss").count() == 1
            assert flagged == (share > 0.05) or abs(share - 0.05) < 0.01, (share, cells)
            assert page.locator("#jobs-empty").is_hidden() and page.locator("#jobs-count").inner_text() == "(1)"
            _shot(page, "jobs")
        finally:
            loader.kill()
            loader.wait(timeout=30)
