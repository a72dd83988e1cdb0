"""The benchmarks page renders the Ray sync, fleet simulator, multimodal and schedule suites from their results, and
names the run of each suite when results merge runs."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402

RAY_SYNC = {
    "mib": 64, "node_mib_s": 8, "shard_mib": 4, "transfers": 8, "stored_bytes": 64 * 2**20,
    "nodes_1": {"runs": [{"seconds": 9.5, "copies_by_node": [16]}, {"seconds": 9.41, "copies_by_node": [16]}],
                "best_s": 9.41, "mib_s": 6.8},
    "nodes_2": {"runs": [{"seconds": 4.79, "copies_by_node": [8, 8]}], "best_s": 4.79, "mib_s": 13.4},
    "speedup": 13.4 / 6.8,
}  # fmt: skip
FLEET_SIM = {
    "mib": 24, "rate": 3 * 2**20, "poll": 0.3, "worst_error": 0.0175,
    "runs": [{"fill_predicted_s": 16.01, "fill_measured_s": 16.29, "error": 0.0175, "predicted": {}, "measured": {}}],
}  # fmt: skip


def test_the_ray_sync_section_shows_both_node_counts_and_the_speedup() -> None:
    text = "\n".join(report._ray_sync({"ray_sync": RAY_SYNC}))
    assert "| 1 | 9.41 s | 6.8 | 16; 16 |" in text
    assert "| 2 | 4.79 s | 13.4 | 8 + 8 |" in text
    assert "**1.97x**" in text and "8 MiB/s" in text
    assert "| sync MB/s on Ray, 2 nodes | 1 node (each capped to 8 MiB/s) | 1.97x |" in report._headline_rows(
        {"ray_sync": RAY_SYNC}
    )


def test_the_fleet_sim_section_shows_prediction_measure_and_error() -> None:
    text = "\n".join(report._fleet_sim({"fleet_sim": FLEET_SIM}))
    assert "| 1 | 16.01 s | 16.29 s | +1.8% |" in text
    assert "Worst error 1.8%" in text and "3 MiB/s" in text


def test_a_suite_that_did_not_run_or_failed_says_so_or_nothing() -> None:
    assert report._ray_sync({}) == [] and report._fleet_sim({}) == []
    failed = report._ray_sync({"ray_sync": {"error": "Ray is not installed"}})
    assert "Ray is not installed" in failed
    assert report._headline_rows({"ray_sync": {"error": "x"}}) == []


def _media(load: float | None, observed: list[float] | None = None) -> dict[str, object]:
    run = {"samples_per_s": 500.0, "first_batch_s": 0.5, "peak_rss_total_mb": 900.0, "samples_per_cpu_s": 700.0}
    runs = [{**run, **({} if load is None else {"load_1m": load + k})} for k in range(3)]
    media: dict[str, object] = {"samples": 6000, "local": {"runs": {"ferry": runs, "mosaic": runs}}}
    return media if observed is None else {**media, "load_1m_observed": observed}


def test_the_multimodal_section_states_the_load_its_runs_shared_the_machine_with() -> None:
    import suite_media

    recorded = "\n".join(suite_media.section(_media(2.5)))
    assert "1-minute load average during these runs: 2.5–4.5" in recorded
    observed = "\n".join(suite_media.section(_media(None, [3.6, 10.3])))
    assert "1-minute load average during these runs: 3.6–10.3" in observed
    assert "load average" not in "\n".join(suite_media.section(_media(None)))  # nothing known: nothing said


def test_the_load_targets_compare_tokens_per_second_and_per_cpu_second_with_the_best_peer_of_each() -> None:
    def runs(tok: float, cpu: float) -> list[dict[str, float]]:
        return [{"tokens_per_s": tok, "tokens_per_cpu_s": cpu}]

    cases = {
        "0": {"runs": {"ferry": runs(500e6, 400e6), "litdata": runs(200e6, 150e6), "mosaic": runs(20e6, 250e6)}},
        "2": {"runs": {"ferry": runs(150e6, 100e6), "litdata": runs(40e6, 60e6)}},
    }
    lines = report._twice_the_peers(cases, "cold epoch")
    assert lines[0] == (
        "- cold epoch, 0 workers: tokens/s, ferry ÷ best peer: 2.50 (target ≥ 2) — met; "
        "tokens per CPU s, ferry ÷ best peer: 1.60 (target ≥ 2) — **not met**"
    )  # per CPU second the best peer is MosaicML's 250, not litdata, the faster one
    assert lines[1].endswith("tokens per CPU s, ferry ÷ best peer: 1.67 (target ≥ 2) — **not met**")
    assert "tokens/s, ferry ÷ best peer: 3.75 (target ≥ 2) — met" in lines[1]


def test_a_page_from_merged_results_names_the_run_of_each_suite() -> None:
    merged = {
        "load, scaling": {"command": "bench/run.py --only load,scaling", "from": "B.json", "started": "2026-12-05",
                          "machine": {"cpu_model": "Intel(R) Xeon(R) Processor", "cores": 2}},
        "pack": {"command": "bench/run.py", "from": "A.json"},
    }  # fmt: skip
    assert report._merged(merged) == [
        "- The results merge runs; each suite's numbers are those of one run (compare tools within a run):",
        "  - load, scaling: `bench/run.py --only load,scaling` (`B.json`, started 2026-12-05, "
        "on Intel(R) Xeon(R) Processor (2 cores))",
        "  - pack: `bench/run.py` (`A.json`)",
    ]
    assert report._merged({}) == []


def test_merged_results_take_each_suite_from_the_last_run_that_has_it(tmp_path: Path) -> None:
    import json

    import run

    base = {"meta": {"command": "bench/run.py", "commit": "aaa"}, "pack": {"p": 1}, "scale": {"s": 1}}
    later = tmp_path / "B.json"
    later.write_text(json.dumps({"meta": {"command": "bench/run.py --only scale", "commit": "bbb"}, "scale": {"s": 2}}))
    merged = run.merge_runs(base, "A.json", [later])
    assert merged["pack"] == {"p": 1} and merged["scale"] == {"s": 2}
    assert {k: (v["from"], v["commit"]) for k, v in merged["meta"]["merged"].items()} == {
        "pack": ("A.json", "aaa"),
        "scale": ("B.json", "bbb"),
    }
    assert merged["meta"]["results_file"].endswith("-merged.json")
    assert "The runs named above measure everything below" in report._method(merged)[0]
    assert "One run of `make bench`" in report._method(base)[0]


def test_merging_onto_merged_results_keeps_the_run_of_each_suite(tmp_path: Path) -> None:
    import json

    import run

    a = {"meta": {"command": "full", "commit": "aaa"}, "pack": {}, "load": {}, "media": {}}
    b = tmp_path / "B.json"
    b.write_text(json.dumps({"meta": {"command": "--only load", "commit": "bbb"}, "load": {"v": 2}}))
    first = run.merge_runs(a, "A.json", [b])
    c = tmp_path / "C.json"
    c.write_text(json.dumps({"meta": {"command": "--only media", "commit": "ccc"}, "media": {"v": 3}}))
    second = run.merge_runs(first, first["meta"]["results_file"], [c])
    assert second["load"] == {"v": 2} and second["media"] == {"v": 3}
    assert {k: (v["from"], v["commit"]) for k, v in second["meta"]["merged"].items()} == {
        "pack": ("A.json", "aaa"),  # not the merged file: the run that measured it
        "load": ("B.json", "bbb"),
        "media": ("C.json", "ccc"),
    }


SCHEDULE = {
    "throughput": {
        "3-phase": [
            {"samples_per_s": 39000.0, "samples_per_cpu_s": 39100.0},
            {"samples_per_s": 41000.0, "samples_per_cpu_s": 40900.0},
        ],
        "single-phase": [{"samples_per_s": 36000.0, "samples_per_cpu_s": 36100.0}],
    },
    "ratio": 1.111, "ratio_cpu": 1.105, "target": 0.95,
    "resume": [
        {"phases": 1, "position": 10**6, "resume_s": 0.054},
        {"phases": 1000, "position": 10**15, "resume_s": 0.072},
    ],
}  # fmt: skip


def test_the_schedule_section_shows_throughput_per_mixture_and_resume_by_phases() -> None:
    text = "\n".join(report._schedule({"schedule": SCHEDULE}))
    assert "| 3-phase | 40000 (39000–41000) | 40000 (39100–40900) |" in text
    assert "| single-phase | 36000 | 36100 |" in text
    assert "1.111 in samples/s, 1.105 per CPU second (target ≥ 0.95)" in text
    assert "| 1 | 1e+06 | 0.054 |" in text and "| 1000 | 1e+15 | 0.072 |" in text
    assert "{" not in text  # no raw result dicts on the page


def test_a_run_is_at_its_commit_whatever_earlier_runs_wrote_into_bench_results(tmp_path: Path) -> None:
    import subprocess

    import envs

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "latest.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = envs.commit(tmp_path)
    assert head and not head.endswith("+changes")
    (tmp_path / "bench" / "results" / "latest.json").write_text('{"run": 1}')  # the previous run's results
    assert envs.commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")  # what is measured changed
    assert envs.commit(tmp_path) == head + "+changes"
