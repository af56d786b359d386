"""What a push looks like on the wire for each target type: pure functions, no I/O.

Every piece of text in a Message is treated as untrusted (alerts and summaries quote user names and
notes), so each format makes all of it inert. Our own markup is added around the text, never read
from it:
- control and format characters become visible escapes (app.core.text.inert), so one line stays one line;
- WeCom markdown and Slack/Mattermost mrkdwn: the characters that start markup, links or mentions
  (`* _ ~ ` # [ ] < > | \\ @ &`; `&` starts an entity such as `&lt;`) become their full-width look-alikes,
  which every client shows as text. `<@userid>`, `@all`, `<!channel>`, `[x](url)` and `*bold*` so read as written.
- generic JSON carries the inert text as plain strings: a JSON string is data already.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from app.core.text import inert

WECOM_LIMIT = 4096  # bytes of UTF-8 in markdown.content (WeCom group robot)
SLACK_LIMIT = 39_000  # characters; Slack truncates a message's text at 40,000
TRUNCATED = "\n…(truncated)"
LINE_LIMIT = 1000  # characters of one line of text

_LOOKALIKE = {ord(c): chr(ord(c) + 0xFEE0) for c in "*_~`#[]<>|\\@&"}  # ASCII -> the full-width form


@dataclass(frozen=True, slots=True)
class Message:
    """One push: `kind` (alert.firing, alert.resolved, summary, test), a title, lines of text, named fields."""

    kind: str
    time: int  # epoch seconds
    title: str
    lines: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "time": self.time, "title": self.title, "lines": list(self.lines),
                           "fields": [list(f) for f in self.fields]}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Message":
        data = json.loads(text)
        return cls(str(data["kind"]), int(data["time"]), str(data["title"]), tuple(map(str, data.get("lines", ()))),
                   tuple((str(k), str(v)) for k, v in data.get("fields", ())))


def plain(text: str) -> str:
    """Inert and on one line: the base every format builds on."""
    return inert(str(text), LINE_LIMIT)


def markup_inert(text: str) -> str:
    """Plain text that no markdown or mrkdwn reader turns into markup, links or mentions, on one line."""
    return plain(str(text).translate(_LOOKALIKE))  # inert's own escapes (\x0a) come after: a backslash before x is text


def body(target_type: str, message: Message) -> bytes:
    """The JSON request body for a target of this type."""
    if target_type == "wecom":
        payload = {"msgtype": "markdown", "markdown": {"content": wecom_content(message)}}
    elif target_type == "slack":
        payload = {"text": slack_text(message)}
    elif target_type == "webhook":
        payload = generic(message)
    else:
        raise ValueError(f"unknown target type {target_type!r}")
    return json.dumps(payload, ensure_ascii=False).encode()


def wecom_content(message: Message) -> str:
    parts = [f"**{markup_inert(message.title)}**"]
    parts += [f"> {markup_inert(k)}: {markup_inert(v)}" for k, v in message.fields]
    parts += [markup_inert(line) for line in message.lines]
    return truncate_utf8("\n".join(parts), WECOM_LIMIT)


def slack_text(message: Message) -> str:
    parts = [f"*{markup_inert(message.title)}*"]
    parts += [f"{markup_inert(k)}: {markup_inert(v)}" for k, v in message.fields]
    parts += [markup_inert(line) for line in message.lines]
    text = "\n".join(parts)
    return text if len(text) <= SLACK_LIMIT else text[: SLACK_LIMIT - len(TRUNCATED)] + TRUNCATED


def generic(message: Message) -> dict:
    return {
        "kind": message.kind,
        "time": datetime.fromtimestamp(message.time, timezone.utc).isoformat().replace("+00:00", "Z"),
        "title": plain(message.title),
        "text": "\n".join(plain(line) for line in message.lines),
        "fields": {plain(k): plain(v) for k, v in message.fields},
    }


def truncate_utf8(text: str, limit: int) -> str:
    """`text` within `limit` bytes of UTF-8, cut on a character boundary and marked when cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    keep = data[: limit - len(TRUNCATED.encode())].decode(errors="ignore")  # drops a character cut in half
    return keep + TRUNCATED
