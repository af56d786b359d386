"""`board ical` through either door: the service in process, or the real agent's socket as a member's CLI reaches it."""

import json
import socket

import icalendar


def test_the_calendar_is_the_same_through_either_transport(target, cli):
    rc, out, err = cli("book", "--cards", "0-3", "--start", "tomorrow 9:00", "--for", "2h", "--class", "online",
                       "--note", "prod; TP4, \x1b[31mred", "--json")
    assert rc == 0, err
    booking = json.loads(out)
    rc, out, err = cli("ical", "--mine")
    assert rc == 0 and err == "", err
    [event] = icalendar.Calendar.from_ical(out).walk("VEVENT")
    assert event["UID"] == f"board-booking-{booking['id']}@{socket.gethostname()}"
    assert event["SUMMARY"] == f"{booking['user']} · cards 0-3 · online"
    assert event["DESCRIPTION"] == f"prod; TP4, \\x1b[31mred\n\nboard booking #{booking['id']}"
    assert cli("ical", "--mine")[1] == out  # and again, the same
