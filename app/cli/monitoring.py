"""`board monitoring dashboard` and `board monitoring rules`: the Grafana dashboard and the Prometheus alert rules
that come with board (app/monitoring), printed for a file: `board monitoring dashboard > board.json`."""

from __future__ import annotations

from app.output import EXIT_OK


def add_parser(command, common) -> None:
    p = command("monitoring", cmd_usage, "the Grafana dashboard and the Prometheus alert rules for board's /metrics")
    p.description = ("Print what a team that runs Prometheus and Grafana loads: the dashboard (import it in Grafana)"
                     " or the alert rules (a file in Prometheus's rule_files). See docs/monitoring.md.")
    sub = p.add_subparsers(metavar="WHAT")
    for name, handler, text in (
            ("dashboard", cmd_dashboard, "the Grafana dashboard (JSON): board monitoring dashboard > board.json"),
            ("rules", cmd_rules, "the Prometheus alert rules (YAML): board monitoring rules > board-alerts.yml")):
        shown = sub.add_parser(name, parents=[common], help=text, description=text)
        shown.set_defaults(handler=handler, json=False)


def cmd_usage(ctx) -> int:
    from app.errors import BadInput

    raise BadInput("board monitoring: say which, dashboard or rules (board monitoring dashboard > board.json)")


def cmd_dashboard(ctx) -> int:
    from app.monitoring import DASHBOARD, read

    print(read(DASHBOARD), end="")
    return EXIT_OK


def cmd_rules(ctx) -> int:
    from app.monitoring import RULES, read

    print(read(RULES), end="")
    return EXIT_OK
