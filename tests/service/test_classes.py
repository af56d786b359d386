"""Who may use a class ([classes]) and how many keys a member holds, as each member would meet them: in process and
through the real agent on its socket, each user a process of their own (tests/service/test_service_permissions.py's
worlds). Issue 31: a key's class was self-chosen (bob made an `online` key), and keys were free (300 in 0.6 s).

Here `online` is for the admins' group and alice, `finetune` for no one, batch and experiment (not named) for
everyone: bob is refused online (exit 4, naming the class and who may), alice by name and carol by her group may,
and the refusal writes nothing but its audit event.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from app.errors import BadInput, NotPermitted
from tests.service.test_service_permissions import HOUR, opened_world, tomorrow, uid
from tests.unix_users import ADMIN_GROUP
from tests.users.conftest import unix_users  # noqa: F401 - the users, as tests/users has them

pytestmark = pytest.mark.real_users

CLASSES = f'\n[classes]\nonline = ["@{ADMIN_GROUP}", "alice"]\nfinetune = []\n'
BOB_ONLINE = (f"bob may not use class online: it is for @{ADMIN_GROUP}, alice ([classes] in the service's config);"
              " use batch or experiment")


@pytest.fixture(scope="module", params=["local", "socket"])
def world(request):
    for made in opened_world(request, "board-classes-", 31000, CLASSES):
        made.root.call("key_list")  # the database is made (in process, on first use)
        yield made


@pytest.fixture(autouse=True)
def clean(world):
    """After each test root cancels every booking ahead and revokes every key, so the next starts afresh."""
    yield
    for booking in world.root.call("list", start=int(datetime.now().timestamp()))["bookings"]:
        world.root.call("cancel", id=booking["id"])
    for key in world.root.call("key_list", all=True):
        if key["revoked"] is None:
            world.root.call("key_revoke", id=key["id"])


def book(world, user: str, klass: str, card: int = 0, **more) -> dict:
    start = tomorrow()
    return world[user].call("book", cards=[card], start=start, end=start + HOUR, **{"class": klass}, **more)


def test_a_member_may_not_book_a_class_kept_for_others_and_is_told_who_may(world):
    before, mark = world.written(), world.mark()
    start = tomorrow()
    attempts = [("book", {"cards": [0], "start": start, "end": start + HOUR}),
                ("book", {"count": 2, "start": start, "end": start + HOUR}),
                ("book", {"count": 1, "start": start, "end": start + HOUR, "or_later": True})]  # --asap
    for op, args in attempts:
        with pytest.raises(NotPermitted) as refused:
            world["bob"].call(op, **args, **{"class": "online"})
        assert refused.value.exit_code == 4 and str(refused.value) == BOB_ONLINE
    # Asking what would work is refused alike, and writes nothing at all.
    for op, args in [("plan", {"count": 1, "start": start, "end": start + HOUR}),
                     ("next_free", {"cards": [0], "start": start, "end": start + HOUR}),
                     ("slots", {"count": 1, "start": start, "end": start + HOUR})]:
        with pytest.raises(NotPermitted, match="^bob may not use class online: it is for"):
            world["bob"].call(op, **args, **{"class": "online"})
    assert world.written() == before
    assert world.refusals_since(mark) == [("bob", uid("bob"), "create", None)] * 3


def test_those_named_may_and_a_class_not_named_is_everyones(world):
    assert book(world, "alice", "online", 0)["class"] == "online"  # by name
    assert book(world, "carol", "online", 1)["class"] == "online"  # by her group
    assert book(world, "bob", "batch", 2)["class"] == "batch"  # not named: everyone, as without [classes]
    assert book(world, "bob", "experiment", 3)["class"] == "experiment"
    with pytest.raises(NotPermitted, match="^carol may not use class finetune: it is for no one"):
        book(world, "carol", "finetune", 4)  # an empty list is no one, admins too


def test_a_series_of_a_class_kept_for_others_is_refused_in_one_line(world):
    first = datetime.now(timezone.utc).date() + timedelta(days=2)
    args = {"cards": [5], "every": "day", "start": "9:00", "until": "10:00", "from": first.isoformat(),
            "to": (first + timedelta(days=2)).isoformat(), "class": "online"}
    before, mark = world.written(), world.mark()
    with pytest.raises(NotPermitted) as refused:
        world["bob"].call("series_book", **args)
    assert str(refused.value) == BOB_ONLINE
    assert world.written() == before and world.refusals_since(mark) == [("bob", uid("bob"), "series", None)]
    assert len(world["alice"].call("series_book", **args)["bookings"]) == 3


def test_an_admin_gives_a_booking_only_to_someone_who_may_hold_its_class(world):
    booking = book(world, "alice", "online", 6)
    before, mark = world.written(), world.mark()
    with pytest.raises(NotPermitted) as refused:
        world["carol"].call("reassign", id=booking["id"], user="bob")
    assert str(refused.value) == BOB_ONLINE  # the holder-to-be is checked, not the admin
    assert world.written() == before
    assert world.refusals_since(mark) == [("carol", uid("carol"), "reassign", booking["id"])]
    assert world["carol"].call("reassign", id=booking["id"], user="carol")["user"] == "carol"


def test_a_key_of_a_class_kept_for_others_is_refused_and_the_default_is_one_they_may_use(world):
    mark = world.mark()
    with pytest.raises(NotPermitted) as refused:
        world["bob"].call("key_new", **{"class": "online"})
    assert refused.value.exit_code == 4 and str(refused.value) == BOB_ONLINE
    with pytest.raises(NotPermitted, match="^bob may not use class online"):
        world["carol"].call("key_new", user="bob", **{"class": "online"})  # for bob, by an admin: still bob's class
    assert world.rows("SELECT count(*) FROM api_keys WHERE uid = ? AND revoked_at IS NULL", uid("bob")) == [(0,)]
    assert [e[:5] for e in world.events_since(mark)] == [("bob", uid("bob"), "key_new", None, False),
                                                         ("carol", uid("carol"), "key_new", None, False)]
    assert world["alice"].call("key_new", **{"class": "online"})["class"] == "online"
    assert world["carol"].call("key_new", **{"class": "online"})["class"] == "online"
    book(world, "alice", "online", 7)
    assert world["alice"].call("key_new")["class"] == "online"  # her usual class, which she may use
    assert world["bob"].call("key_new")["class"] == "batch"


def test_the_twentieth_key_is_accepted_the_twenty_first_refused_and_a_revoked_one_frees_a_place(world):
    made = [world["bob"].call("key_new", name=f"k{n}") for n in range(20)]
    with pytest.raises(NotPermitted) as refused:
        world["bob"].call("key_new")
    assert refused.value.exit_code == 4 and str(refused.value) == (
        "bob has 20 live keys, the most a member may hold ([gateway] max_keys_per_user); revoke one first"
        " (board key list, board key revoke ID)")
    assert len(world["bob"].call("key_list")) == 20
    with pytest.raises(BadInput):  # another member cannot free a place of bob's
        world["alice"].call("key_revoke", id=made[0]["id"])
    world["bob"].call("key_revoke", id=made[0]["id"])
    world["bob"].call("key_new")
    with pytest.raises(NotPermitted, match="^bob has 20 live keys"):
        world["bob"].call("key_new")
    assert world["carol"].call("key_new", user="bob")["user"] == "bob"  # an admin's key for an account: apart
