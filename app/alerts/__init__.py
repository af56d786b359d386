"""Alerts (issue 12 section 4): rules.py finds what is wrong, engine.py fires, resolves and pushes."""
