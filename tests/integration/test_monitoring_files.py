"""docker/grafana and docker/prometheus name only what ferry's /metrics exports, and compose wires them.

The names and label sets come from a real service's /metrics (a synced dataset and an open
error, so every family has samples); the dashboard's queries, legends and variables and the alert
rules' expressions and annotations are parsed here (no promtool on these machines): a small
PromQL lexer finds every selector, its label matchers and the grouping labels.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from configs import Staging
from conftest import free_port
from helpers import TOKEN, pack, running_service, wait_until
from prometheus_client.parser import text_string_to_metric_families

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "ferry.json"
RULES = DOCKER / "prometheus" / "alerts.yml"
RULE_TESTS = DOCKER / "prometheus" / "alerts_test.yml"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards" / "ferry.yaml"
COMPOSE = DOCKER / "compose.yaml"

#: Labels Prometheus adds to every scraped series, and the series it makes up per target.
TARGET_LABELS = frozenset({"job", "instance"})
SYNTHETIC = {"up": TARGET_LABELS}

# --- PromQL, as far as names go -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    | (?P<range>\[[^\]]*\])
    | (?P<number>0x[0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:ms|[smhdwy])?)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<var>\$\{?\w+\}?)
    | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=]|[{}(),])
    )""",
    re.VERBOSE,
)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"}


@dataclass
class Query:
    """What a PromQL expression names: selectors (metric, matched labels) and grouping labels."""

    selectors: list[tuple[str, set[str]]] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot lex PromQL at {expr[pos : pos + 20]!r} in {expr!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def parse_promql(expr: str) -> Query:
    toks = tokens(expr)
    depth = {"(": 0, "{": 0}
    for _, t in toks:
        if t in "({":
            depth[t] += 1
        elif t in ")}":
            depth["(" if t == ")" else "{"] -= 1
            if min(depth.values()) < 0:
                raise ValueError(f"unbalanced {t!r} in {expr!r}")
    if any(depth.values()):
        raise ValueError(f"unbalanced brackets in {expr!r}")
    q, i = Query(), 0
    while i < len(toks):
        kind, t = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and t in _GROUPING:
            i += 1
            if nxt == "(":
                i, labels = _label_list(toks, i + 1, expr)
                q.grouping |= labels
            continue
        if kind == "ident" and (t.lower() in _KEYWORDS or nxt == "(" or nxt in ("by", "without")):
            i += 1  # an operator, a function or an aggregation
            continue
        if kind == "ident" or t == "{":
            name = t if kind == "ident" else ""
            i += 1 if kind == "ident" else 0
            matchers: dict[str, tuple[str, str]] = {}
            if i < len(toks) and toks[i][1] == "{":
                i = _matchers(toks, i + 1, matchers, expr)
            if not name and matchers.get("__name__", ("", ""))[0] == "=":
                name = matchers["__name__"][1]
            if not name:
                raise ValueError(f"a selector without a metric name in {expr!r}")
            q.selectors.append((name, set(matchers) - {"__name__"}))
            continue
        i += 1
    return q


def _label_list(toks: list[tuple[str, str]], i: int, expr: str) -> tuple[int, set[str]]:
    labels: set[str] = set()
    while toks[i][1] != ")":
        kind, t = toks[i]
        if kind == "ident":
            labels.add(t)
        elif t != ",":
            raise ValueError(f"unexpected {t!r} in a label list of {expr!r}")
        i += 1
    return i + 1, labels


def _matchers(toks: list[tuple[str, str]], i: int, out: dict[str, tuple[str, str]], expr: str) -> int:
    while toks[i][1] != "}":
        if toks[i][1] == ",":
            i += 1
            continue
        (k1, label), (_, op), (k3, value) = toks[i : i + 3]
        if k1 != "ident" or op not in ("=", "!=", "=~", "!~") or k3 != "string":
            raise ValueError(f"malformed label matcher {label}{op}{value} in {expr!r}")
        out[label] = (op, value[1:-1])
        i += 3
    return i + 1


_LEGEND = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
_RULE_TEMPLATE = re.compile(r"\$labels\.([A-Za-z_]\w*)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<expr>.+),\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$", re.DOTALL)


def problems(expr: str, templated: set[str], exported: dict[str, set[str]]) -> list[str]:
    """What in ``expr`` (and the labels ``templated`` into its legend/annotations) /metrics lacks."""
    q = parse_promql(expr)
    out, available = [], set(TARGET_LABELS)
    for name, labels in q.selectors:
        if name not in exported:
            out.append(f"unknown metric {name!r} in {expr!r}")
            continue
        available |= exported[name]
        out += [f"{name} has no label {lb!r} (in {expr!r})" for lb in sorted(labels - exported[name] - TARGET_LABELS)]
    out += [f"no metric of {expr!r} has the label {lb!r}" for lb in sorted((q.grouping | templated) - available)]
    return out


# --- the files ------------------------------------------------------------------------------------


def dashboard_queries(doc: dict[str, Any]) -> Iterator[tuple[str, str, set[str]]]:
    """(where, PromQL, labels its legend uses) of every panel target and query variable."""
    for panel in _panels(doc["panels"]):
        for t in panel.get("targets", []):
            yield f"panel {panel['title']!r}", t["expr"], set(_LEGEND.findall(t.get("legendFormat", "")))
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.match(query)
        assert m, f"variable {var['name']}: only label_values(SELECTOR, LABEL) is checked here: {query!r}"
        yield f"variable {var['name']!r}", m["expr"], {m["label"]}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))  # collapsed rows hold their panels


def rule_queries(doc: dict[str, Any]) -> Iterator[tuple[str, str, set[str]]]:
    for group in doc["groups"]:
        for rule in group["rules"]:
            texts = [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
            templated = {lb for text in texts for lb in _RULE_TEMPLATE.findall(str(text))}
            yield f"rule {rule.get('alert') or rule.get('record')!r}", rule["expr"], templated


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _all_queries() -> list[tuple[str, str, set[str]]]:
    return [*dashboard_queries(json.loads(DASHBOARD.read_text())), *rule_queries(_load_yaml(RULES))]


# --- against a live /metrics ----------------------------------------------------------------------


def exported_metrics(text: str) -> dict[str, set[str]]:
    """Sample name → label names, from Prometheus text exposition (only series that have samples)."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


@dataclass
class Live:
    url: str  # the API's base URL
    exported: dict[str, set[str]]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A real daemon + API: one dataset replicated east → west, one open error; its /metrics parsed."""
    root = tmp_path_factory.mktemp("monitoring")
    staging = Staging(str(root / "staging"), "1MiB", "64KiB", interval=0.1)
    with pytest.MonkeyPatch.context() as mp, running_service(root, mp, staging=staging) as svc:
        version = pack(svc.east("corpus"), 40).version_id
        (root / "east" / "broken").mkdir()
        (root / "east" / "broken" / "manifest.json").write_text("not json")  # an open, non-retryable error
        wait_until(lambda: svc.west_version("corpus") == version, what="west to publish corpus")
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            job = {"name": "train", "rank": 0, "world_size": 1, "batch_size": 4, "phases": [{"start": 0, "quota": [1]}],
                   "sources": [{"urls": [svc.west("corpus")], "version": version, "seed": "0", "shuffle": "global",
                                "window": 8, "mode": "tokens", "seq_len": 16}]}  # fmt: skip
            assert http.post("/api/v1/jobs", json=job).status_code == 201  # a job, so the per-job families have samples
            text = wait_until(
                # the copied bytes are counted when the copy's stats land, which may trail the publish
                lambda: (
                    (t := http.get("/metrics").text)
                    and all(
                        f in t for f in ("ferry_errors{", "ferry_copied_bytes_total{", "ferry_job_staged_ahead_bytes{")
                    )
                    and t
                ),
                what="an open error, the copied bytes and a staged job in /metrics",
            )
        yield Live(svc.url, {**exported_metrics(text), **SYNTHETIC})


@pytest.fixture(scope="module")
def exported(live: Live) -> dict[str, set[str]]:
    return live.exported


def test_the_scrape_has_every_family_with_samples(exported: dict[str, set[str]]) -> None:
    """The fixture's data gives every family of /metrics a sample, so its labels are known."""
    assert exported["ferry_copied_bytes_total"] == {"dataset", "source", "destination"}
    assert exported["ferry_errors"] == {"dataset", "cluster", "retryable"}
    assert exported["ferry_lag_seconds"] == {"dataset", "cluster"}
    assert exported["ferry_uptime_seconds"] == set()
    assert exported["ferry_job_stall_seconds_total"] == {"training_job"}
    assert exported["ferry_job_staging_missing_bytes"] == {"training_job"}


def test_dashboard_and_rules_name_only_exported_metrics_and_labels(exported: dict[str, set[str]]) -> None:
    queries = _all_queries()
    assert len(queries) >= 15
    found = [f"{where}: {p}" for where, expr, templated in queries for p in problems(expr, templated, exported)]
    assert found == [], "\n".join(found)


def test_every_ferry_metric_is_on_the_dashboard(exported: dict[str, set[str]]) -> None:
    """A metric /metrics adds shows up on the dashboard (or this test says which one is missing)."""
    doc = json.loads(DASHBOARD.read_text())
    shown = {name for _, expr, _ in dashboard_queries(doc) for name, _ in parse_promql(expr).selectors}
    ferry = {n for n in exported if n.startswith("ferry_") and not n.endswith("_created")}
    assert ferry - shown == set()


def _replaced(node: Any, old: str, new: str) -> Any:
    """``node`` (parsed JSON) with ``old`` replaced by ``new`` in every string in it."""
    if isinstance(node, dict):
        return {k: _replaced(v, old, new) for k, v in node.items()}
    if isinstance(node, list):
        return [_replaced(v, old, new) for v in node]
    return node.replace(old, new) if isinstance(node, str) else node


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("ferry_lag_seconds{", "ferry_lag_secs{", "unknown metric 'ferry_lag_secs'"),
        ('ferry_errors{job="ferry", ', 'ferry_errors{job="ferry", shard="x", ', "ferry_errors has no label 'shard'"),
        ("max by (dataset, cluster)", "max by (dataset, link)", "has the label 'link'"),
        ("{{dataset}} → {{cluster}}", "{{dataset}} → {{destination}}", "has the label 'destination'"),
        ('ferry_lag_seconds{job="ferry"}, cluster)', 'ferry_lag_seconds{job="ferry"}, dst)', "has the label 'dst'"),
    ],
)
def test_a_wrong_name_in_the_dashboard_is_caught(
    exported: dict[str, set[str]], old: str, new: str, complaint: str
) -> None:
    doc = json.loads(DASHBOARD.read_text())
    changed = _replaced(doc, old, new)
    assert changed != doc, f"{old!r} is not in the dashboard"
    found = [p for _, expr, templated in dashboard_queries(changed) for p in problems(expr, templated, exported)]
    assert any(complaint in p for p in found), found


def test_a_wrong_name_in_a_rule_is_caught(exported: dict[str, set[str]]) -> None:
    doc = _load_yaml(RULES)
    rule = next(r for g in doc["groups"] for r in g["rules"] if r["alert"] == "FerrySLABreach")
    rule["expr"] = rule["expr"].replace("ferry_lag_seconds", "ferry_replica_lag_seconds")
    rule["annotations"]["summary"] += " {{ $labels.link }}"
    found = [p for _, expr, templated in rule_queries(doc) for p in problems(expr, templated, exported)]
    assert any("unknown metric 'ferry_replica_lag_seconds'" in p for p in found), found
    errors_rule = next(r for g in doc["groups"] for r in g["rules"] if r["alert"] == "FerryErrorsOpen")
    found = problems(errors_rule["expr"], {"link"}, exported)
    assert found == ["no metric of " + repr(errors_rule["expr"]) + " has the label 'link'"]


def test_promql_lexer_reads_what_the_files_use() -> None:
    q = parse_promql(
        'sum by (dataset) (rate(ferry_copied_bytes_total{source="a,b}", destination=~"$cluster"}[$__rate_interval]))'
        ' / on (dataset) group_left (cluster) {__name__="ferry_pending_bytes", cluster!="x"} offset 5m > bool 1e3'
    )
    assert q.selectors == [
        ("ferry_copied_bytes_total", {"source", "destination"}),
        ("ferry_pending_bytes", {"cluster"}),
    ]
    assert q.grouping == {"dataset", "cluster"}
    for bad in ("sum(ferry_errors", 'ferry_errors{dataset="x"', "ferry_errors{dataset}", "ferry_errors # x"):
        with pytest.raises(ValueError):
            parse_promql(bad)


# --- the files' own shape -------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(ms|[smhdwy]))+$")


def test_rule_file_is_well_formed() -> None:
    doc = _load_yaml(RULES)
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert set(doc) == {"groups"} and all(set(g) <= {"name", "interval", "rules"} for g in doc["groups"])
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    required = {"FerryDown", "FerrySLABreach", "FerryLagGrowing", "FerryErrorsNeedOperator", "FerryErrorsOpen"}
    assert required <= set(names)
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, r["alert"]
        assert _DURATION.match(str(r.get("for", "0s"))), r["alert"]
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert parse_promql(r["expr"]).selectors, r["alert"]


def test_sla_alert_uses_the_sla_of_the_compose_config() -> None:
    """The SLA is not a metric: the rule's threshold must be docker/ferry.toml's sla_minutes."""
    sla_minutes = tomllib.loads((DOCKER / "ferry.toml").read_text())["api"]["sla_minutes"]
    rule = next(r for g in _load_yaml(RULES)["groups"] for r in g["rules"] if r["alert"] == "FerrySLABreach")
    threshold = re.fullmatch(r"(?s).*\bferry_lag_seconds\b.*>\s*(\d+)\s*", rule["expr"])
    assert threshold and int(threshold[1]) == sla_minutes * 60
    assert f"{sla_minutes:g}-minute" in rule["annotations"]["summary"]
    lag_panel = next(p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"].startswith("Lag per link"))
    steps = lag_panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == sla_minutes * 60


def test_dashboard_is_well_formed() -> None:
    doc = json.loads(DASHBOARD.read_text())
    uid = _load_yaml(DATASOURCES)["datasources"][0]["uid"]
    panels = list(_panels(doc["panels"]))
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert p["datasource"]["uid"] == uid, p["title"]
        assert all(t["datasource"]["uid"] == uid and t["refId"] for t in p["targets"]), p["title"]
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, p["title"]
    for var in doc["templating"]["list"]:
        assert var["datasource"]["uid"] == uid


def test_compose_wires_prometheus_and_grafana_to_files_in_docker() -> None:
    compose = _load_yaml(COMPOSE)
    services = compose["services"]
    mounts: dict[str, dict[str, Path]] = {}
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            host, target = vol.split(":")[:2]
            if host.startswith("."):
                assert (DOCKER / host).exists(), f"{name} mounts {host}, which docker/ lacks"
                mounts.setdefault(name, {})[target] = (DOCKER / host).resolve()
    prom = mounts["prometheus"]
    assert prom["/etc/prometheus/prometheus.yml"] == PROMETHEUS.resolve()
    config = _load_yaml(PROMETHEUS)
    for rule_file in config["rule_files"]:
        assert prom[rule_file] == RULES.resolve()
    (job,) = config["scrape_configs"]
    host, port = job["static_configs"][0]["targets"][0].split(":")
    api = tomllib.loads((DOCKER / "ferry.toml").read_text())["api"]
    assert host in services and int(port) == api["port"] and not api["read_protected"]
    assert job["job_name"] == "ferry"  # the dashboard and rules select job="ferry"

    graf = mounts["grafana"]
    assert graf["/etc/grafana/provisioning"] == (DOCKER / "grafana" / "provisioning").resolve()
    source = _load_yaml(DATASOURCES)["datasources"][0]
    assert re.fullmatch(r"http://prometheus:9090/?", source["url"]) and "prometheus" in services
    provider = _load_yaml(PROVIDERS)["providers"][0]
    assert graf[provider["options"]["path"]] == DASHBOARD.parent.resolve()
    assert not any("GF_INSTALL_PLUGINS" in str(k) for k in services["grafana"].get("environment", {}))


def test_promtool_accepts_the_config_and_the_rules_pass_their_unit_tests(tmp_path: Path) -> None:
    """Where promtool is installed: the real PromQL parser, and each alert firing (and not) on made-up series."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); the PromQL lexer above still ran")
    config = tmp_path / "prometheus.yml"  # the rule file where compose mounts it -> where it is here
    config.write_text(PROMETHEUS.read_text().replace("/etc/prometheus/alerts.yml", str(RULES)))
    for cmd in (["check", "config", str(config)], ["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        proc = subprocess.run([promtool, *cmd], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr


# Grafana's variables, as Grafana would expand them for "All" on a 1 s scrape interval
_GRAFANA_VARS = {'"$dataset"': '".*"', '"$cluster"': '".*"', "$__rate_interval": "30s"}


def _expand(expr: str) -> str:
    for var, value in _GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


@contextlib.contextmanager
def _prometheus(tmp_path: Path, target: str) -> Iterator[httpx.Client]:
    """A real Prometheus scraping ``target`` every second and evaluating alerts.yml, on a free port."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    config = yaml.safe_load(PROMETHEUS.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES)]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    with (tmp_path / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            # it listens before its storage is open and answers 503 until then (for a while on a loaded machine)
            wait_until(lambda: _ready(http, proc), timeout=60, what="prometheus /-/ready")
            yield http
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(http: httpx.Client, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, "prometheus exited; see prometheus.log in the test's tmp_path"
    try:
        return http.get("/-/ready").status_code == 200
    except httpx.TransportError:
        return False  # not listening yet


def _query(http: httpx.Client, expr: str) -> list[Any]:
    try:
        r = http.get("/api/v1/query", params={"query": expr})
    except httpx.TransportError:
        return []  # not listening yet
    assert r.status_code == 200 and r.json()["status"] == "success", f"{expr!r}: {r.text}"
    return list(r.json()["data"]["result"])


def test_a_real_prometheus_runs_every_query_and_rule(live: Live, tmp_path: Path) -> None:
    """Where Prometheus is installed: it scrapes a live ferry, each dashboard query parses and returns
    series, each variable lists values, and each alert rule evaluates without error."""
    with _prometheus(tmp_path, live.url.removeprefix("http://")) as prom:
        wait_until(lambda: _query(prom, 'rate(ferry_uptime_seconds{job="ferry"}[30s])'), timeout=60, what="two scrapes")
        doc = json.loads(DASHBOARD.read_text())
        for where, expr, labels in dashboard_queries(doc):
            if where.startswith("variable"):
                r = prom.get(f"/api/v1/label/{labels.pop()}/values", params={"match[]": expr}).json()
                assert r["status"] == "success" and r["data"], f"{where}: {r}"
            else:
                assert _query(prom, _expand(expr)), f"{where}: no series for {expr!r}"

        def evaluated() -> list[dict[str, Any]]:
            groups = prom.get("/api/v1/rules").json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return rules if rules and all(r["lastEvaluation"] > "2000" for r in rules) else []

        rules = wait_until(evaluated, timeout=60, what="every rule evaluated")
        assert [(r["name"], r["health"], r.get("lastError", "")) for r in rules if r["health"] != "ok"] == []
        assert {r["name"] for r in rules} == {r["alert"] for g in _load_yaml(RULES)["groups"] for r in g["rules"]}
