"""Pushes to where the team already talks (issue 12 section 5): WeCom, Slack/Mattermost, generic webhooks.

- formats: a Message and its body for each target type, all text made inert;
- outbox: the table (schema v6) that holds pushes until a target takes them;
- deliver: the HTTP side, with retries and backoff, run by the service's delivery thread;
- summary: the board summary at `[notify] summary_at`.
The service's side (the call alerts use, the thread, the operations) is app.service.box.notify; the command
(`board notify test`) is app.cli.notify.
"""
