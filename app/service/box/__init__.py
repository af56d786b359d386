"""Watching the box: enforcement, registered processes, supervised servers, alerts, pushes, /metrics, watchers."""
