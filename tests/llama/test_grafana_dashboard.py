"""app/monitoring's Grafana dashboard and Prometheus rules name only what board's /metrics really exports: every
metric and label in their PromQL, against a real scrape of the real agent (user board, [metrics] listen, the
simulated fleet, [history] on for the energy, [power] for the policy) and of the real gateway after a real completion
through it to a real llama-server (the request, token and latency series exist only after one). The expressions are
also valid PromQL: the real promtool parses each one.

Needs root (real users), the llama-server binary and promtool (tests/conftest.py's tiers).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.monitoring import DASHBOARD, RULES, read
from tests.llama.test_gateway import ALIAS, running_team
from tests.service.test_metrics_prometheus import free_port, get, wait_for

pytestmark = pytest.mark.real_users
TARGET_LABELS = {"instance", "job"}  # Prometheus adds them to every series it scrapes
# Families the real scrape declares with no series until something happens (an Xid fault, an alert fired): their
# labels as app.service.box.metrics gives them (tests/unit/test_metrics.py checks those).
SERIES_LATER = {"board_xid_errors_total": {"code"}, "board_alerts_total": {"rule"}}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\$\w+|\d+(?:\.\d+)?(?:e\d+)?[smhdwy]?|[A-Za-z_:][A-Za-z0-9_:]*|=~|!~|!=|==|>=|<='
                   r'|[{}()\[\],=<>+\-*/^%|]|\s+')


def names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names a PromQL expression (or a Grafana label_values query) mentions."""
    tokens = [t for t in TOKEN.findall(expr) if not t.isspace()]
    assert "".join(tokens) == re.sub(r"\s+", "", expr), f"not read whole: {expr}"
    metrics, labels = set(), set()
    stack: list[str] = []  # what each open bracket is: "{", "labels" (by/on/... lists), "label_values", "("
    for i, token in enumerate(tokens):
        after = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in "{([":
            before = tokens[i - 1] if i else ""
            stack.append("{" if token == "{" else "labels" if before in LABEL_LISTS else
                         "label_values" if before == "label_values" else token)
        elif token in "})]":
            stack.pop()
        elif token.startswith('"') or token.startswith("$") or token[0].isdigit():
            if stack and stack[-1] == "{" and tokens[i - 2] == "__name__":  # {__name__=~"a|b"}: names, alternated
                metrics |= set(token.strip('"').split("|"))
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", token):
            if stack and stack[-1] in ("{", "labels"):
                labels.add(token)
            elif stack and stack[-1] == "label_values" and tokens[i - 1] == ",":
                labels.add(token)
            elif after in ("(", "by", "without") or token in KEYWORDS:
                pass  # a function, an aggregation (its `by` may come first) or a keyword
            else:
                metrics.add(token)
    labels.discard("__name__")
    return metrics, labels


def dashboard_queries() -> list[tuple[str, str]]:
    """(expression, legend) of each panel's queries, and the variables' queries."""
    board = json.loads(read(DASHBOARD))
    found = [(t["expr"], t.get("legendFormat", "")) for p in board["panels"] for t in p.get("targets", ())]
    return found + [(v["query"], "") for v in board["templating"]["list"] if v["type"] == "query"]


def rule_expressions() -> list[str]:
    """Each rule's expr in alerts.yml: one line, or the indented block after `expr: |`."""
    found, lines = [], read(RULES).splitlines()
    for i, line in enumerate(lines):
        if (m := re.match(r"\s+expr: (.*)", line)) is None:
            continue
        if m.group(1) != "|":
            found.append(m.group(1))
            continue
        block = []
        for more in lines[i + 1:]:
            if len(more) - len(more.lstrip()) <= len(line) - len(line.lstrip()):
                break
            block.append(more.strip())
        found.append(" ".join(block))
    return found


def exported(text: str) -> dict[str, set[str]]:
    """Each series name the exposition has (counters' _total, histograms' _bucket ...) and the labels it carries."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
        if not family.samples and family.type == "counter" and f"{family.name}_total" in SERIES_LATER:
            found[f"{family.name}_total"] = set(SERIES_LATER[f"{family.name}_total"])
    return found


def test_the_reader_of_promql_finds_names_and_labels():
    """The test's own reader, on the shapes the files use. Nearest wrong: a `by (...)` label taken for a metric, a
    function for a metric, a label_values label missed."""
    assert names('sum by (model, le) (rate(board_gateway_request_duration_seconds_bucket{code!~"2.."}[$__rate_interval]))') \
        == ({"board_gateway_request_duration_seconds_bucket"}, {"model", "le", "code"})
    assert names('a / on (instance) group_left (holder) b offset 1h > 0.25') == ({"a", "b"}, {"instance", "holder"})
    assert names('label_values(board_gpu_state{instance=~"$host"}, index)') == ({"board_gpu_state"}, {"instance", "index"})
    assert names('sum by (instance) (increase({__name__=~"x_total|y_total"}[30d])) > 3.5') == ({"x_total", "y_total"},
                                                                                             {"instance"})


@pytest.fixture(scope="module")
def scrapes(llama_server, tiny_model):
    """The agent's and the gateway's /metrics, after a completion through the gateway, a refused booking and the
    history's first energy."""
    port = free_port()
    config = (f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n\n[history]\nsample_s = 1\n\n[power]\nlimit_w = 500\n\n'
              '[gateway]\nlisten = "{listen}"\n')
    with running_team(llama_server, tiny_model, config, port=4) as team:
        key = team.key("carol")["key"]
        answer = team.client(key).chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}],
                                                          max_tokens=4)
        assert answer.usage.completion_tokens > 0
        # A refusal: the refused counter has a series once there is a reason to count.
        assert team.board.run("carol", "book", "--cards", "2", "--for", "1h").returncode == 3
        agent_url = f"http://127.0.0.1:{port}/metrics"

        def counted() -> str | None:
            """The scrape once it has the refusal (its view is read again within 5 s) and the energy (alice's
            server holds card 2: the sampler counts it from its second sample)."""
            text = get(agent_url).decode()
            return text if "board_energy_joules_total{" in text and "board_bookings_refused_total{" in text else None

        agent = wait_for("the refusal and the energy on alice's booking in /metrics", counted, timeout=90,
                         log=team.log.read_text())
        yield agent, get(f"{team.url}/metrics").decode()


def test_every_query_names_only_metrics_and_labels_that_metrics_exports(scrapes):
    """Nearest wrong: a counter without its _total, a histogram's series without _bucket, a label the family does
    not carry (the gateway's latency has no `user`), a metric only the other exporter has (dcgm's)."""
    agent, gateway = scrapes
    series = {**exported(agent), **exported(gateway)}
    assert {"board_gateway_completion_tokens_total", "board_gateway_request_duration_seconds_bucket",
            "board_energy_joules_total", "board_gpu_power_policy_watts", "board_gpu_pcie_link_utilization_ratio",
            "board_booking_wait_seconds_sum"} <= set(series)  # the scrape has what the panels need
    unknown = []
    for expr, legend in dashboard_queries() + [(expr, "") for expr in rule_expressions()]:
        metrics, labels = names(expr)
        assert metrics, expr
        missing = metrics - set(series)
        carried = set().union(*(series.get(m, set()) for m in metrics)) | TARGET_LABELS
        legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        if missing or (labels | legend_labels) - carried:
            unknown.append(f"{expr}: metrics {sorted(missing)}, labels {sorted((labels | legend_labels) - carried)}")
    assert unknown == []


def test_promtool_parses_every_dashboard_query(prometheus_bin, tmp_path):
    """Each query, Grafana's variables filled in, as a recording rule: promtool parses them all (a label_values()
    variable is Grafana's, not PromQL: its metric selector is parsed)."""
    fill = {"$__rate_interval": "5m", "$__range": "1h", "$host": ".*", "$card": ".*"}
    rules = []
    for n, (expr, _) in enumerate(dashboard_queries()):
        for variable, value in fill.items():
            expr = expr.replace(variable, value)
        if expr.startswith("label_values("):
            expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
        rules.append({"record": f"board:query_{n}", "expr": expr})
    (tmp_path / "queries.yml").write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([str(prometheus_bin / "promtool"), "check", "rules", "queries.yml"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout
