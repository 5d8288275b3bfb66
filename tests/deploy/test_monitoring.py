"""The monitoring bundle: the ServiceMonitor, the alerts and the Grafana dashboard.

The alerts are checked and unit-tested with promtool, which deploy/tools/install.sh builds from
its Go module beside kustomize and helm. Every metric that the alerts and the dashboard query
must be one gpuadm exports, as read from webhook.observe.metrics itself. The Helm objects are
off by default; when on, they must match deploy/monitoring, the kustomize copy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes.client
import pytest
import yaml

from certs.material import service_dns_names
from tests.deploy import test_manifests as manifests
from tests.deploy.test_manifests import (
    INSTALL_SCRIPT,
    NAMESPACE,
    RENDERS,
    REPO,
    Obj,
    Render,
    Rendered,
    schema_errors,
)
from webhook.observe.metrics import Metrics
from webhook.observe.readings import AuditReading, MemoReading, QueueReading, QuotaReading

# The session fixtures of test_manifests.py: the tools, the renders and the API client.
tools = manifests.tools
render = manifests.render
api_client = manifests.api_client

CHART_FILES = REPO / "deploy" / "helm" / "gpuadm" / "files"
RULES = CHART_FILES / "gpuadm-rules.yaml"
DASHBOARD = CHART_FILES / "gpuadm-dashboard.json"
MONITORING = REPO / "deploy" / "monitoring"
RULES_TEST = MONITORING / "tests" / "gpuadm-rules-test.yaml"
OPERATIONS = REPO / "docs" / "operations.md"
MONITORING_GROUP = "monitoring.coreos.com"

ALL_ON = (
    "--set",
    "monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.prometheusRule.enabled=true",
    "--set",
    "monitoring.dashboard.enabled=true",
)
# The labels the Prometheus Operator gives every target of a ServiceMonitor.
OPERATOR_TARGET_LABELS = {"job", "instance", "namespace", "service", "pod", "container", "endpoint"}


@pytest.fixture(scope="session")
def promtool(tools: dict[str, Path]) -> Path:
    """promtool, built by deploy/tools/install.sh with kustomize and helm.

    `tools` has run the script, and failed with its message if a build failed. It hands back
    kustomize and helm only, so ask the script again, which now just prints the directories.
    """
    result = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, check=True
    )
    bin_dirs = [Path(d) for d in result.stdout.strip().splitlines()[-1].split(os.pathsep)]
    paths = [d / "promtool" for d in bin_dirs if (d / "promtool").is_file()]
    assert paths, f"deploy/tools/install.sh printed {bin_dirs}, none of which holds promtool"
    return paths[0]


def run_promtool(promtool: Path, *args: str) -> str:
    result = subprocess.run(
        [str(promtool), *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def kustomize_monitoring(tools: dict[str, Path]) -> Rendered:
    result = subprocess.run(
        [str(tools["kustomize"]), "build", "deploy/monitoring"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kustomize build deploy/monitoring failed:\n{result.stderr}"
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return Rendered("kustomize-monitoring", objects)


def load_rules() -> Obj:
    rules: Obj = yaml.safe_load(RULES.read_text())
    return rules


def alerting_rules() -> list[Obj]:
    return [rule for group in load_rules()["groups"] for rule in group["rules"] if "alert" in rule]


def load_dashboard() -> Obj:
    dashboard: Obj = json.loads(DASHBOARD.read_text())
    return dashboard


def dashboard_panels(dashboard: Obj) -> Iterator[Obj]:
    """Every panel, those inside collapsed rows included; rows themselves left out."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def dashboard_queries(dashboard: Obj) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    queries = [
        (f"panel {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            queries.append((f"variable {variable['name']}", label_values_selector(text)))
    return queries


def label_values_selector(query: str) -> str:
    """The series selector of a Grafana `label_values(SELECTOR, LABEL)` query."""
    match = re.fullmatch(r"\s*label_values\((.+),\s*[A-Za-z_]\w*\s*\)\s*", query)
    assert match, f"{query!r} is not label_values(SELECTOR, LABEL)"
    return match[1]


# --- which metrics gpuadm exports -----------------------------------------------------------

# The sample names a query can use, by the type of a metric family.
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def exported_metrics() -> dict[str, set[str]]:
    """Each metric family gpuadm exports -> the sample names a query may use for it."""
    metrics = Metrics()
    # The collectors' families appear once they are watched, even with nothing to read.
    metrics.watch_quota(lambda: [])
    metrics.watch_queue(lambda: [])
    metrics.watch_plan_memo(lambda: MemoReading(0, 0, 0))
    metrics.watch_tasks(lambda: [])
    metrics.watch_audit(lambda: AuditReading(0, 0, 0))
    metrics.watch_hours(lambda: [])
    families = {}
    for family in metrics.registry.collect():
        assert family.type in SAMPLE_SUFFIXES, f"{family.name}: a {family.type} is new here"
        families[family.name] = {family.name + s for s in SAMPLE_SUFFIXES[family.type]}
    return families


def exported_sample_names() -> set[str]:
    return set().union(*exported_metrics().values())


# --- the metric names in a PromQL expression ------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIERS = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: its identifiers that are not functions,
    keywords, label names, label values, durations or Grafana variables."""
    text = _STRINGS.sub('""', expr)
    names = {"__name__"} if "__name__" in text else set()
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    for match in _IDENTIFIERS.finditer(text):
        name, call = match.groups()
        if not call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        pytest.param("rate(node_cpu_seconds_total[5m])", {"node_cpu_seconds_total"}, id="other"),
        pytest.param(
            'sum by (namespace, pod) (rate(a_total{job="x", ns=~"b_c|d"}[$__rate_interval]))',
            {"a_total"},
            id="labels-and-variables",
        ),
        pytest.param(
            "histogram_quantile(0.99, sum(rate(h_bucket[5m])) by (le)) > on (le) group_left b",
            {"h_bucket", "b"},
            id="histogram-and-matching",
        ),
        pytest.param("absent(up{job='gpuadm'} == 1) or vector(0)", {"up"}, id="absent"),
        pytest.param("min(x > 0) - time() < 14 * 86400 offset 1h", {"x"}, id="numbers-and-offset"),
        pytest.param("a unless ignoring(z) b_total @ end()", {"a", "b_total"}, id="keywords"),
        pytest.param('{__name__=~"gpuadm_.+"}', {"__name__"}, id="selected-by-name"),
        pytest.param("1e3 + 0x1f", set(), id="no-metric"),
    ],
)
def test_metric_names_finds_what_an_expression_selects(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def test_exported_metrics_are_read_from_the_registry() -> None:
    families = exported_metrics()
    # A counter is queried with _total and a histogram by its series, never by the family name.
    assert families["gpuadm_admission_requests"] == {"gpuadm_admission_requests_total"}
    assert (
        "gpuadm_admission_duration_seconds_bucket" in families["gpuadm_admission_duration_seconds"]
    )
    # The collectors' families are there though they read nothing, and no process_ metric is.
    assert "gpuadm_quota_limit_gpus" in families
    assert "gpuadm_queue_oldest_wait_seconds" in families
    assert "gpuadm_task_last_success_age_seconds" in families
    assert all(name.startswith("gpuadm_") for name in families)


def _unknown_metrics(queries: list[tuple[str, str]]) -> list[str]:
    known = exported_sample_names() | {"up"}
    return [
        f"{where}: {sorted(metric_names(expr) - known)} in {expr}"
        for where, expr in queries
        if metric_names(expr) - known
    ]


def test_alerts_query_only_metrics_gpuadm_exports() -> None:
    queries = [(rule["alert"], rule["expr"]) for rule in alerting_rules()]
    assert _unknown_metrics(queries) == []


def test_dashboard_queries_only_metrics_gpuadm_exports() -> None:
    queries = dashboard_queries(load_dashboard())
    assert queries
    assert _unknown_metrics(queries) == []


def test_dashboard_shows_every_metric_gpuadm_exports() -> None:
    shown = set().union(*(metric_names(expr) for _, expr in dashboard_queries(load_dashboard())))
    missing = sorted(family for family, names in exported_metrics().items() if not names & shown)
    assert missing == [], f"add a panel for these to {DASHBOARD.relative_to(REPO)}"


# --- the alerts -----------------------------------------------------------------------------


def test_promtool_checks_the_rules(promtool: Path) -> None:
    output = run_promtool(promtool, "check", "rules", str(RULES))
    assert f"SUCCESS: {len(load_rules()['groups'][0]['rules'])} rules found" in output


def test_promtool_unit_tests_of_the_alerts_pass(promtool: Path) -> None:
    output = run_promtool(promtool, "test", "rules", str(RULES_TEST))
    assert "SUCCESS" in output


def test_promtool_unit_tests_can_fail(promtool: Path, tmp_path: Path) -> None:
    """The unit tests notice a rule that no longer fires: here, a quota alert at 200%."""
    rules = tmp_path / "deploy" / "helm" / "gpuadm" / "files" / RULES.name
    rules.parent.mkdir(parents=True)
    rules.write_text(RULES.read_text().replace("> 0.9", "> 2"))
    unit_tests = tmp_path / "deploy" / "monitoring" / "tests" / RULES_TEST.name
    unit_tests.parent.mkdir(parents=True)
    unit_tests.write_text(RULES_TEST.read_text())
    result = subprocess.run(
        [str(promtool), "test", "rules", str(unit_tests)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "alertname: GpuadmNamespaceNearQuota" in result.stdout + result.stderr


def test_unit_tests_test_the_shipped_rules() -> None:
    unit_tests = yaml.safe_load(RULES_TEST.read_text())
    assert [(RULES_TEST.parent / f).resolve() for f in unit_tests["rule_files"]] == [RULES]


def test_every_alert_has_cases_that_fire_it_and_cases_that_must_not() -> None:
    """Each rule (an alert name with a severity) is seen firing; each alert name is also
    evaluated where it must stay quiet."""
    cases = [
        case
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    fired = {
        (case["alertname"], expected["exp_labels"]["severity"])
        for case in cases
        for expected in case.get("exp_alerts") or []
    }
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    rules = {(rule["alert"], rule["labels"]["severity"]) for rule in alerting_rules()}
    assert rules - fired == set(), "rules that no unit test sees firing"
    assert {alert for alert, _ in rules} - quiet == set(), "alerts never tested to stay quiet"
    assert fired - rules == set(), "unit tests expect alerts the rules do not have"


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    }


def _runbook_base() -> str:
    """The chart's default runbookBaseURL: the project's docs, where the rules file points."""
    values = yaml.safe_load((REPO / "deploy" / "helm" / "gpuadm" / "values.yaml").read_text())
    base: str = values["monitoring"]["prometheusRule"]["runbookBaseURL"]
    return base


def check_runbook_urls(rules: Obj, base: str) -> None:
    """Each alert links, absolutely, to <base>/docs/operations.md#<its name>, a heading there."""
    anchors = _anchors(OPERATIONS.read_text())
    for rule in (rule for group in rules["groups"] for rule in group["rules"]):
        name, url = rule["alert"], rule["annotations"]["runbook_url"]
        parsed = urlsplit(url)
        assert (parsed.scheme in {"http", "https"}, bool(parsed.netloc)) == (True, True), url
        assert url == f"{base}/docs/operations.md#{name.lower()}", name
        assert parsed.fragment in anchors, f"docs/operations.md has no heading {name}"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_in_operations_md() -> None:
    assert urlsplit(_runbook_base()).scheme == "https"
    for rule in alerting_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name
    check_runbook_urls(load_rules(), _runbook_base())


def test_kustomize_prometheus_rule_holds_the_rules_file() -> None:
    """deploy/monitoring/prometheusrule.yaml is its header and then the rules file, indented."""
    copy = MONITORING / "prometheusrule.yaml"
    header, spec, _ = copy.read_text().partition("\nspec:\n")
    indented = "".join(
        f"  {line}" if line.strip() else line for line in RULES.read_text().splitlines(True)
    )
    assert spec, f"{copy.relative_to(REPO)} has no line `spec:`"
    assert f"{header}{spec}{indented}" == copy.read_text(), (
        f"{copy.relative_to(REPO)} has drifted from {RULES.relative_to(REPO)}; copy it again:\n"
        f"  {{ sed '/^spec:$/q' {copy.relative_to(REPO)}; "
        f"sed 's/^./  &/' {RULES.relative_to(REPO)}; }} > new && mv new {copy.relative_to(REPO)}"
    )


# --- the dashboard --------------------------------------------------------------------------

# Grafana's variables, for promtool to read the dashboard's queries as PromQL.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "job": "gpuadm"}


def test_dashboard_is_grafana_json_with_panels() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "gpuadm"
    panels = list(dashboard_panels(dashboard))
    assert panels
    ids = [panel["id"] for panel in dashboard["panels"]] + [
        panel["id"] for row in dashboard["panels"] for panel in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_dashboard_queries_are_promql(promtool: Path, tmp_path: Path) -> None:
    """promtool parses each query, Grafana's variables filled in, as a recording rule."""

    def fill(match: re.Match[str]) -> str:
        return GRAFANA_VARIABLES.get(match[1], ".*")

    queries = dashboard_queries(load_dashboard())
    rules = [
        {"record": f"gpuadm_dashboard:query_{i}", "expr": re.sub(r"\$\{?(\w+)\}?", fill, expr)}
        for i, (_, expr) in enumerate(queries)
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    output = run_promtool(promtool, "check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in output


# --- the Helm and kustomize objects ---------------------------------------------------------


def helm_monitoring(render: Render, *extra: str) -> Rendered:
    """The chart rendered with every monitoring object on."""
    return Rendered("helm-monitoring", render("helm", *ALL_ON, *extra))


def without_labels(obj: Obj) -> Obj:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "labels"}}


def _monitoring_objects(objects: list[Obj]) -> list[Obj]:
    return [
        o
        for o in objects
        if o["apiVersion"].startswith(f"{MONITORING_GROUP}/")
        or (o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpuadm-dashboard")
    ]


@pytest.mark.parametrize("name", [name for name in RENDERS if name.startswith("helm")])
def test_helm_renders_no_monitoring_objects_by_default(name: str, render: Render) -> None:
    assert _monitoring_objects(render(name)) == []


def test_helm_renders_each_monitoring_object_on_its_own(render: Render) -> None:
    for value, kind in (
        ("serviceMonitor", "ServiceMonitor"),
        ("prometheusRule", "PrometheusRule"),
        ("dashboard", "ConfigMap"),
    ):
        objects = _monitoring_objects(render("helm", "--set", f"monitoring.{value}.enabled=true"))
        assert [o["kind"] for o in objects] == [kind]


def check_service_monitor(monitor: Obj, gpuadm: Rendered, namespace: str) -> None:
    """The ServiceMonitor scrapes /metrics on the Service's https port, trusting the CA of
    gpuadm-tls for the name gpuadm.<namespace>.svc."""
    service = gpuadm.one("Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"] == namespace
    spec = monitor["spec"]
    assert "namespaceSelector" not in spec, "the Service is in the ServiceMonitor's namespace"
    selector = spec["selector"]["matchLabels"]
    assert selector
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = spec["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container,) = gpuadm.one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "https", "containerPort": port["targetPort"], "protocol": "TCP"} in container[
        "ports"
    ]
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    assert endpoint["honorLabels"] is True
    tls = endpoint["tlsConfig"]
    assert tls == {
        "serverName": f"gpuadm.{namespace}.svc",
        "ca": {"secret": {"name": "gpuadm-tls", "key": "ca.crt"}},
    }
    assert tls["serverName"] in service_dns_names("gpuadm", namespace)


def test_helm_service_monitor_scrapes_the_service(render: Render) -> None:
    check_service_monitor(
        helm_monitoring(render).one("ServiceMonitor"), helm_monitoring(render), NAMESPACE
    )


def test_kustomize_service_monitor_scrapes_the_base_service(
    tools: dict[str, Path], render: Render
) -> None:
    monitor = kustomize_monitoring(tools).one("ServiceMonitor")
    check_service_monitor(monitor, Rendered("kustomize-base", render("kustomize-base")), NAMESPACE)


def test_the_ca_secret_is_the_one_gpuadm_and_cert_manager_write(render: Render) -> None:
    managed = Rendered("helm", render("helm"))
    role = managed.one("Role", "gpuadm-manage-tls")
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert any(r.get("resourceNames") == ["gpuadm-tls"] for r in secrets)
    certificate = Rendered("cm", render("kustomize-cert-manager")).one("Certificate")["spec"]
    assert certificate["secretName"] == "gpuadm-tls"
    assert f"gpuadm.{NAMESPACE}.svc" in certificate["dnsNames"]


def test_prometheus_must_honor_gpuadm_labels(render: Render) -> None:
    """gpuadm's series carry labels the Operator also gives each target: the ServiceMonitor
    must keep gpuadm's. None of them may be the job or the instance."""
    metrics = Metrics()
    metrics.answered("validate", "CREATE", "allowed", 0.001)
    metrics.watch_quota(lambda: [QuotaReading("team-a", "a100", 1.0, 4.0)])
    metrics.watch_queue(lambda: [QueueReading("team-a", "a100", 1, 60.0)])
    label_names = {
        label
        for family in metrics.registry.collect()
        for sample in family.samples
        for label in sample.labels
    }
    clashing = label_names & OPERATOR_TARGET_LABELS
    assert clashing >= {"namespace", "endpoint"}
    assert not clashing & {"job", "instance"}
    (endpoint,) = helm_monitoring(render).one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True


def test_helm_prometheus_rule_is_the_rules_file(render: Render) -> None:
    rule = helm_monitoring(render).one("PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"] == load_rules()


def test_helm_dashboard_configmap_holds_the_dashboard(render: Render) -> None:
    configmap = helm_monitoring(render).one("ConfigMap", "gpuadm-dashboard")
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(configmap["data"]) == ["gpuadm.json"]
    assert json.loads(configmap["data"]["gpuadm.json"]) == load_dashboard()


def test_helm_monitoring_follows_the_release_namespace(render: Render) -> None:
    rendered = helm_monitoring(render, "--namespace", "gpu-admission")
    for obj in _monitoring_objects(rendered.objects):
        assert obj["metadata"]["namespace"] == "gpu-admission"
    check_service_monitor(rendered.one("ServiceMonitor"), rendered, "gpu-admission")


def test_helm_monitoring_values(render: Render) -> None:
    base = "https://git.example.com/gpuadm/blob/v0.1.0"
    rendered = helm_monitoring(
        render,
        "--set",
        "monitoring.serviceMonitor.labels.release=kps",
        "--set",
        "monitoring.serviceMonitor.interval=1m",
        "--set",
        "monitoring.serviceMonitor.tlsConfig.insecureSkipVerify=true",
        "--set",
        "monitoring.prometheusRule.labels.release=kps",
        "--set",
        f"monitoring.prometheusRule.runbookBaseURL={base}/",
        "--set",
        "monitoring.dashboard.namespace=grafana",
        "--set",
        "monitoring.dashboard.annotations.grafana_folder=GPUs",
    )
    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["interval"] == "1m"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    rule = rendered.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    expected = load_rules()
    for group in expected["groups"]:
        for each in group["rules"]:
            each["annotations"]["runbook_url"] = each["annotations"]["runbook_url"].replace(
                _runbook_base(), base
            )
    assert rule["spec"] == expected
    check_runbook_urls(rule["spec"], base)
    dashboard = rendered.one("ConfigMap", "gpuadm-dashboard")
    assert dashboard["metadata"]["namespace"] == "grafana"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "GPUs"}


def test_helm_runbook_urls_are_absolute(render: Render) -> None:
    """By default at the project's docs; a base of the admin's own, with or without its
    trailing slash, replaces it; a relative base is refused."""
    check_runbook_urls(helm_monitoring(render).one("PrometheusRule")["spec"], _runbook_base())
    for given in ("http://docs.internal:8080/gpuadm", "http://docs.internal:8080/gpuadm/"):
        rule = helm_monitoring(render, "--set", f"monitoring.prometheusRule.runbookBaseURL={given}")
        check_runbook_urls(rule.one("PrometheusRule")["spec"], "http://docs.internal:8080/gpuadm")
    for relative in ("docs", "", "/gpuadm"):
        with pytest.raises(AssertionError, match="does not match pattern"):
            render("helm", *ALL_ON, "--set", f"monitoring.prometheusRule.runbookBaseURL={relative}")


def test_kustomize_monitoring_matches_helm(tools: dict[str, Path], render: Render) -> None:
    kustomize = kustomize_monitoring(tools)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in kustomize.objects) == [
        ("PrometheusRule", "gpuadm"),
        ("ServiceMonitor", "gpuadm"),
    ]
    helm = helm_monitoring(render)
    for obj in kustomize.objects:
        assert without_labels(obj) == without_labels(helm.one(obj["kind"])), obj["kind"]


# --- the schema check -----------------------------------------------------------------------

# The Prometheus Operator's CRDs are not in the kubernetes client, so, as for cert-manager in
# test_manifests.py, the fields these objects may use are listed by hand from the
# monitoring.coreos.com/v1 API reference. A name maps to None (a value or a map of any keys),
# to its own fields, or to [its fields] for a list of objects.
_KEY_REF = {"name": None, "key": None, "optional": None}
_SECRET_OR_CONFIGMAP = {"secret": _KEY_REF, "configMap": _KEY_REF}
_TLS_CONFIG = {
    "ca": _SECRET_OR_CONFIGMAP,
    "cert": _SECRET_OR_CONFIGMAP,
    "keySecret": _KEY_REF,
    "serverName": None,
    "insecureSkipVerify": None,
    "caFile": None,
    "certFile": None,
    "keyFile": None,
    "minVersion": None,
    "maxVersion": None,
}
_ENDPOINT = {
    "port": None,
    "targetPort": None,
    "path": None,
    "scheme": None,
    "params": None,
    "interval": None,
    "scrapeTimeout": None,
    "tlsConfig": _TLS_CONFIG,
    "bearerTokenSecret": _KEY_REF,
    "authorization": None,
    "basicAuth": None,
    "oauth2": None,
    "honorLabels": None,
    "honorTimestamps": None,
    "trackTimestampsStaleness": None,
    "metricRelabelings": None,
    "relabelings": None,
    "proxyUrl": None,
    "followRedirects": None,
    "enableHttp2": None,
    "filterRunning": None,
}
SERVICE_MONITOR_FIELDS: dict[str, Any] = {
    "jobLabel": None,
    "targetLabels": None,
    "podTargetLabels": None,
    "endpoints": [_ENDPOINT],
    "selector": {"matchLabels": None, "matchExpressions": None},
    "namespaceSelector": {"any": None, "matchNames": None},
    "sampleLimit": None,
    "targetLimit": None,
    "labelLimit": None,
    "labelNameLengthLimit": None,
    "labelValueLengthLimit": None,
    "attachMetadata": {"node": None},
    "scrapeClass": None,
}
_RULE = {
    "alert": None,
    "record": None,
    "expr": None,
    "for": None,
    "keep_firing_for": None,
    "labels": None,
    "annotations": None,
}
PROMETHEUS_RULE_FIELDS: dict[str, Any] = {
    "groups": [
        {
            "name": None,
            "labels": None,
            "interval": None,
            "query_offset": None,
            "limit": None,
            "partial_response_strategy": None,
            "rules": [_RULE],
        }
    ]
}


def _unknown_fields(value: Any, fields: Any, path: str) -> Iterator[str]:
    if fields is None:
        return
    if isinstance(fields, list):
        if not isinstance(value, list):
            yield f"{path}: {value!r} is not a list"
            return
        for i, item in enumerate(value):
            yield from _unknown_fields(item, fields[0], f"{path}[{i}]")
        return
    if not isinstance(value, dict):
        yield f"{path}: {value!r} is not an object"
        return
    for key, item in value.items():
        if key not in fields:
            yield f"{path}.{key}: unknown field"
        else:
            yield from _unknown_fields(item, fields[key], f"{path}.{key}")


def monitoring_errors(obj: Obj) -> list[str]:
    """Missing required fields and unknown fields of a ServiceMonitor or PrometheusRule."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    errors = []
    if obj["apiVersion"] != f"{MONITORING_GROUP}/v1":
        errors.append(f"{where}: apiVersion {obj['apiVersion']}, want {MONITORING_GROUP}/v1")
    if set(obj) - {"apiVersion", "kind", "metadata", "spec"}:
        errors.append(f"{where}: unknown top-level fields {set(obj) - {'spec', 'metadata'}}")
    spec = obj.get("spec", {})
    if obj["kind"] == "ServiceMonitor":
        fields = SERVICE_MONITOR_FIELDS
        if "selector" not in spec:
            errors.append(f"{where}: spec.selector is required")
        for i, endpoint in enumerate(spec.get("endpoints", [])):
            if not ("port" in endpoint or "targetPort" in endpoint):
                errors.append(f"{where}: spec.endpoints[{i}] names no port")
    elif obj["kind"] == "PrometheusRule":
        fields = PROMETHEUS_RULE_FIELDS
        for group in spec.get("groups", []):
            if not group.get("name"):
                errors.append(f"{where}: a group has no name")
            for rule in group.get("rules", []):
                if ("alert" in rule) == ("record" in rule) or "expr" not in rule:
                    errors.append(f"{where}: {rule} needs an expr and one of alert, record")
    else:
        return [f"{where}: unexpected {MONITORING_GROUP} kind"]
    errors.extend(_unknown_fields(spec, fields, f"{where}.spec"))
    return errors


def test_monitoring_objects_fit_their_api_schema(
    tools: dict[str, Path], render: Render, api_client: kubernetes.client.ApiClient
) -> None:
    objects = _monitoring_objects(helm_monitoring(render).objects)
    objects += kustomize_monitoring(tools).objects
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap",
        "PrometheusRule",
        "PrometheusRule",
        "ServiceMonitor",
        "ServiceMonitor",
    ]
    errors = []
    for obj in objects:
        if obj["apiVersion"].startswith(f"{MONITORING_GROUP}/"):
            errors.extend(monitoring_errors(obj))
        else:
            errors.extend(schema_errors(api_client, obj))
    assert errors == []


def test_monitoring_check_catches_what_the_client_cannot(
    render: Render, api_client: kubernetes.client.ApiClient
) -> None:
    monitor = helm_monitoring(render).one("ServiceMonitor")
    # The kubernetes client has no model for it: the check of test_manifests.py would fail.
    assert schema_errors(api_client, monitor) == [
        "ServiceMonitor/gpuadm: no model V1ServiceMonitor in the kubernetes client"
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    endpoint["honorLabel"] = endpoint.pop("honorLabels")
    endpoint["tlsConfig"]["ca"]["secrets"] = endpoint["tlsConfig"]["ca"].pop("secret")
    assert monitoring_errors(monitor) == [
        "ServiceMonitor/gpuadm.spec.endpoints[0].tlsConfig.ca.secrets: unknown field",
        "ServiceMonitor/gpuadm.spec.endpoints[0].honorLabel: unknown field",
    ]
    rule = helm_monitoring(render).one("PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["record"] = "gpuadm:down"
    assert monitoring_errors(rule) != []
