"""What a team that runs Prometheus and Grafana loads, built from board's own /metrics (docs/monitoring.md):
grafana.json, a dashboard to import, and alerts.yml, Prometheus alert rules with the thresholds of board's own
alerts. Both are plain files in the package; `board monitoring dashboard|rules` prints them."""

from __future__ import annotations

from importlib.resources import files

DASHBOARD = "grafana.json"
RULES = "alerts.yml"


def read(name: str) -> str:
    """One of the files, as shipped."""
    return files(__package__).joinpath(name).read_text(encoding="utf-8")
