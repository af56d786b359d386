"""Bookings as an RFC 5545 calendar (`board ical`): one VEVENT per booking, for the calendars people already use.

A small writer of our own rather than the icalendar package (which the tests parse the output with): the
format is a few fixed properties, and this keeps `board ical` free of a runtime dependency and its output a
pure function of the bookings. Nothing here reads the clock: the same bookings give the same bytes, so a
calendar that re-fetches an unchanged file sees no change, and a changed booking changes only its own event.

- UID `board-booking-<id>@<domain>` stays with the booking through moves and reassignments.
- DTSTAMP is when the booking was made (the store keeps no time of last change).
- Events come in booking-id order, not start order, so moving one booking does not reorder the file.
- A standing slot's occurrences are exported as instances, each with the category "series N".
- Users and notes are other people's text: control and format characters become visible escapes
  (core.text.inert) before the TEXT escaping of backslash, semicolon, comma and newline.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from app.core.text import inert as _inert
from app.model import Booking

PRODID = "-//board//board ical//EN"
LINE_OCTETS = 75  # RFC 5545 3.1: content lines longer than this are folded, CRLF and one space
REFRESH = "PT15M"  # a hint to subscribed calendars; the cron line in docs/commands.md rewrites the file as often


def calendar(bookings: Iterable[Booking], *, domain: str, name: str = "board") -> bytes:
    """The whole VCALENDAR, UTF-8 with CRLF line ends; cancelled bookings are left out.

    `domain` is the right-hand side of every UID (the host name): keep it fixed for UIDs to stay stable."""
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        f"PRODID:{PRODID}",
        "CALSCALE:GREGORIAN",
        f"X-WR-CALNAME:{escape_text(inert(name))}",
        f"REFRESH-INTERVAL;VALUE=DURATION:{REFRESH}",
        f"X-PUBLISHED-TTL:{REFRESH}",
    ]
    for booking in sorted((b for b in bookings if b.status != "cancelled"), key=lambda b: b.id):
        lines.extend(event(booking, domain))
    lines.append("END:VCALENDAR")
    return ("\r\n".join(fold(line) for line in lines) + "\r\n").encode("utf-8")


def event(booking: Booking, domain: str) -> list[str]:
    """One VEVENT's content lines, unfolded."""
    categories = [booking.klass] + ([f"series {booking.series_id}"] if booking.series_id is not None else [])
    return [
        "BEGIN:VEVENT",
        f"UID:{uid(booking.id, domain)}",
        f"DTSTAMP:{utc(booking.created_at or booking.start)}",
        f"DTSTART:{utc(booking.start)}",
        f"DTEND:{utc(booking.end)}",
        f"SUMMARY:{escape_text(summary(booking))}",
        f"DESCRIPTION:{escape_text(description(booking))}",
        f"CATEGORIES:{','.join(escape_text(c) for c in categories)}",
        "STATUS:CONFIRMED",
        "END:VEVENT",
    ]


def uid(booking_id: int, domain: str) -> str:
    return escape_text(f"board-booking-{booking_id}@{inert(domain)}")


def summary(booking: Booking) -> str:
    """'alice · cards 0-3 · online'."""
    return f"{inert(booking.user)} · cards {card_ranges(booking.cards)} · {inert(booking.klass)}"


def description(booking: Booking) -> str:
    """The note, made inert line by line (its line breaks stay line breaks), then which booking this is."""
    where = f"board booking #{booking.id}" + (f", series {booking.series_id}" if booking.series_id is not None else "")
    if not booking.note:
        return where
    note = "\n".join(inert(line) for line in booking.note.replace("\r\n", "\n").split("\n"))
    return f"{note}\n\n{where}"


def card_ranges(cards: Sequence[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6': the card-list grammar people type (core.parse.parse_cards reads it back)."""
    parts: list[str] = []
    ordered = sorted(set(cards))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def utc(epoch: int) -> str:
    """A DATE-TIME in UTC, form 2 of RFC 5545 3.3.5: 20261207T090000Z."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch))


def inert(text: str) -> str:
    """core.text.inert, skipped for text with nothing to escape: printable text has no control, format or line
    separator character. Most notes are plain, and inert's look at each character was most of the export's time."""
    return text if text.isprintable() else _inert(text)


def escape_text(text: str) -> str:
    """A TEXT value (RFC 5545 3.3.11): backslash, semicolon and comma escaped, a line break as \\n."""
    return text.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\n", "\\n")


def fold(line: str) -> str:
    """Split a content line into lines of at most 75 octets, the later ones starting with a space; never inside
    a UTF-8 sequence, so each piece stays valid UTF-8 for readers that decode before they unfold."""
    if len(line) <= LINE_OCTETS and line.isascii():
        return line
    data = line.encode("utf-8")
    pieces, start, room = [], 0, LINE_OCTETS
    while len(data) - start > room:
        cut = start + room
        while data[cut] & 0xC0 == 0x80:  # a continuation byte: cut before the character it belongs to
            cut -= 1
        pieces.append(data[start:cut])
        start, room = cut, LINE_OCTETS - 1  # the leading space counts
    pieces.append(data[start:])
    return b"\r\n ".join(pieces).decode("utf-8")
