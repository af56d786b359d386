"""Every key the board answers to, in one table: the help screen shows it and a test checks it is complete."""

from __future__ import annotations

# (where, keys, what) - `where` names the screen or widget the key works in.
KEYS: tuple[tuple[str, str, str], ...] = (
    ("anywhere", "b", "book cards (the timeline selection, or the highlighted card)"),
    ("anywhere", "m", "my bookings: cancel, release, extend"),
    ("anywhere", "s", "servers: llama-server on your booked cards"),
    ("anywhere", "a", "admin screen (admins only)"),
    ("anywhere", "?", "this help"),
    ("anywhere", "ctrl+p", "command palette: every main action by name"),
    ("anywhere", "q", "quit"),
    ("board", "tab / shift+tab", "move between the card table and the timeline"),
    ("board", "enter", "card detail for the highlighted card"),
    ("board", "t", "timeline: jump to now"),
    ("board", "z", "timeline: zoom (hours, day, week)"),
    ("board", "[ / ]", "timeline: a day earlier / later"),
    ("timeline", "left / right", "one step earlier / later"),
    ("timeline", "up / down", "previous / next card"),
    ("timeline", "shift+arrows", "grow the selection of cards and times"),
    ("timeline", "space", "start (or stop) a selection that the arrows grow"),
    ("timeline", "escape", "clear the selection"),
    ("timeline", "mouse", "click a cell; drag to select cards and times"),
    ("booking form", "enter / ctrl+s", "book it"),
    ("booking form", "ctrl+n", "fill in the next free slot that fits"),
    ("booking form", "tab / shift+tab", "next / previous field"),
    ("booking form", "escape", "close without booking"),
    ("my bookings", "c", "cancel the highlighted booking"),
    ("my bookings", "r", "release it (end it now)"),
    ("my bookings", "e", "extend it"),
    ("admin", "c", "cancel anyone's booking"),
    ("admin", "r", "reassign to other cards or another user"),
    ("servers", "n", "start llama-server on one of your active bookings"),
    ("servers", "x", "stop the highlighted server (asks first)"),
    ("servers", "l", "scroll the highlighted server's log"),
    ("screens", "escape", "back to the board"),
)
