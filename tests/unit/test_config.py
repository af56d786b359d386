import json
import types
import typing
from pathlib import Path

import msgspec
import pytest

from app.cli import main
from app.config import DEFAULT_DB_PATH, ConfigError, ConfigFile, load_config

FULL = """
[storage]
db = "/srv/board/board.db"
[access]
admin_group = "gpu-admins"
[policy]
max_booking_hours = 12
max_ahead_days = 7
max_cards_per_user = 4
[labels]
0 = "slot A"
[[pools]]
name = "prod"
cards = [0, 1, 2, 3]
classes = ["online", "batch", "finetune"]
[pools.windows]
finetune = { hours = "19:00-09:00", weekends = true }
[[pools]]
name = "lab"
cards = [4, 5, 6, 7]
max_hours = 12
[llama]
port_min = 9000
port_max = 9010
model_dirs = ["/models"]
"""


def test_defaults_without_a_file(tmp_path):
    config = load_config(environ={})
    assert config.db_path == DEFAULT_DB_PATH and config.admin_group == "board-admin" and config.pools == ()


def test_a_full_file(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text(FULL)
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    assert config.db_path == Path("/srv/board/board.db")
    assert config.admin_group == "gpu-admins"
    assert (config.policy.max_booking_hours, config.policy.max_cards_per_user) == (12, 4)
    assert [p.name for p in config.pools] == ["prod", "lab"]
    window = config.pools[0].windows["finetune"]
    assert (window.start_minute, window.end_minute, window.weekends) == (19 * 60, 9 * 60, True)
    assert config.pools[1].max_hours == 12 and config.labels == {0: "slot A"}
    assert config.llama.model_dirs == ("/models",) and config.llama.port_min == 9000


def test_night_start(tmp_path):
    assert load_config(environ={}).booking.night_start_minute == 19 * 60
    path = tmp_path / "board.toml"
    path.write_text('[booking]\nnight_start = "20:30"\n')
    assert load_config(environ={"BOARD_CONFIG": str(path)}).booking.night_start_minute == 20 * 60 + 30


def test_history_settings_and_where_the_history_lives(tmp_path):
    config = load_config("/srv/board/board.db", environ={})
    assert (config.history.enabled, config.history.sample_s, config.history.raw_hours, config.history.rollup_days) == (
        True, 10.0, 48.0, 365.0)
    assert config.history_path == Path("/srv/board/board.history.db")
    path = tmp_path / "board.toml"
    path.write_text('[history]\nenabled = false\nsample_s = 30\nrollup_days = 90\ndb = "/data/h.db"\n')
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    assert (config.history.enabled, config.history.sample_s, config.history.rollup_days) == (False, 30, 90)
    assert config.history_path == Path("/data/h.db")


def test_db_precedence(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text(FULL)
    environ = {"BOARD_CONFIG": str(path), "BOARD_DB": "/env/board.db"}
    assert load_config(environ=environ).db_path == Path("/env/board.db")
    assert load_config("/flag/board.db", environ=environ).db_path == Path("/flag/board.db")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[policy\n", "can't read config"),
        ("[polcy]\n", r"unknown section\(s\) polcy"),
        ("[policy]\nmax_hours = 3\n", "unknown key 'max_hours' in \\[policy\\]"),
        ('[[pools]]\nname = "p"\ncards = [0]\nclasses = ["vip"]\n', "unknown class 'vip'"),
        ('[[pools]]\nname = "p"\ncards = [0]\n[pools.windows]\nfinetune = { hours = "25:00-09:00" }\n', "outside 00:00-24:00"),
        ('[policy]\ntimezone = "Mars/Olympus"\n', "not a known time zone"),
        ('[enforce]\nrun_jobs = "kill"\n', "use \"stop\" or \"warn\""),
        ('[service]\nsokcet = "/x"\n', "unknown key 'sokcet' in \\[service\\]"),
        ('[booking]\nnight_start = "24:00"\n', '\\[booking\\] night_start is \'24:00\'; give a time of day such as "19:00"'),
        ('[booking]\nnight_start = "19:75"\n', "night_start is '19:75'"),
        ('[booking]\nnight_start = 19\n', "\\[booking\\] night_start: expected a string, got 19$"),
        ('[booking]\nnight_start = "\u0661\u0669:00"\n', "night_start is"),
        ('[booking]\nnight = "19:00"\n', "unknown key 'night' in \\[booking\\]; known keys: night_start"),
        ('[history]\nsample_s = 0\n', "\\[history\\] sample_s must be a number more than 0, not 0"),
        ('[history]\nraw_hours = "48"\n', '\\[history\\] raw_hours: expected a number, got "48"$'),
        ('[history]\nsample_s = 600\n', "sample_s is at most 300"),
        ('[history]\nenabled = "yes"\n', '\\[history\\] enabled: expected true or false, got "yes"$'),
        ('[history]\nkeep_days = 3\n', "unknown key 'keep_days' in \\[history\\]"),
        ('[classes]\nvip = ["alice"]\n', "\\[classes\\] 'vip' is not a class; use one of online, batch, finetune, experiment"),
        ('[classes]\nonline = "alice"\n', '\\[classes\\] online: expected a list, got "alice"$'),
        ('[classes]\nonline = ["alice", 3]\n', "\\[classes\\] online\\[1\\]: expected a string, got 3$"),
        ('[classes]\nonline = ["@"]\n', "\\[classes\\] online is \\['@'\\]"),
        ('[classes]\nonline = ["al ice"]\n', "\\[classes\\] online is \\['al ice'\\]"),
        ('[classes]\nonline = ["a@b"]\n', "\\[classes\\] online is"),
        ('[[classes]]\nonline = ["alice"]\n', '\\[classes\\]: expected a table, got \\[{"online": \\["alice"\\]}\\]$'),
        ('[gateway]\nmax_keys_per_user = 0\n', "\\[gateway\\] max_keys_per_user must be a number more than 0, not 0"),
        ('[gateway]\nmax_keys_per_user = 2.5\n', "\\[gateway\\] max_keys_per_user: expected an integer, got 2.5$"),
        ('[gateway]\nmax_concurrent_per_user = "8"\n', '\\[gateway\\] max_concurrent_per_user: expected an integer, got "8"$'),
        ('[gateway]\nmax_concurrent_per_user = 4\nmax_concurrent_per_key = 4\n',
         "max_concurrent_per_key is the old name of max_concurrent_per_user .now counted across all of a member's keys.;"
         " keep only max_concurrent_per_user"),
        ('[gateway]\n_renamed = ["x"]\n', "unknown key '_renamed' in \\[gateway\\]"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "board.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        load_config(environ={"BOARD_CONFIG": str(path)})
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_classes_and_the_gateways_per_member_limits(tmp_path):
    config = load_config(environ={})
    assert config.classes == {} and (config.gateway.max_concurrent_per_user, config.gateway.max_keys_per_user) == (8, 20)
    path = tmp_path / "board.toml"
    path.write_text('[classes]\nonline = ["@serving", "alice"]\nbatch = []\n'
                    '[gateway]\nmax_concurrent_per_user = 4\nmax_keys_per_user = 3\n')
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    assert config.classes == {"online": ("@serving", "alice"), "batch": ()}
    assert (config.gateway.max_concurrent_per_user, config.gateway.max_keys_per_user) == (4, 3)
    assert config.gateway._renamed == ()


def test_the_old_per_key_limit_still_loads_as_the_per_member_one(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text("[gateway]\nmax_concurrent_per_key = 5\n")
    settings = load_config(environ={"BOARD_CONFIG": str(path)}).gateway
    assert (settings.max_concurrent_per_user, settings._renamed) == (5, ("max_concurrent_per_key",))


def test_the_gateway_says_at_start_that_the_old_name_is_read_as_the_new_one(tmp_path, monkeypatch, daemon_log):
    from app.gateway import server

    path = tmp_path / "board.toml"
    path.write_text(f'[service]\nsocket = "{tmp_path}/board.sock"\n[gateway]\nmax_concurrent_per_key = 5\n')
    monkeypatch.setattr(server.asyncio, "run", lambda serving: serving.close())  # started, not served
    monkeypatch.setattr(server.os, "umask", lambda mask: mask)
    assert server.run_gateway(load_config(environ={"BOARD_CONFIG": str(path)})) == 0
    assert daemon_log() == (
        "board gateway: [gateway] max_concurrent_per_key is now max_concurrent_per_user (5), counted across all of a"
        " member's keys; rename it in the config\n")


def test_a_named_config_that_does_not_exist(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(environ={"BOARD_CONFIG": str(tmp_path / "missing.toml")})


# -- a wrong type in any key is exit 2, one line naming the section, the key and the value -----------------------

# What each type is called in the one line, and the nearest wrong values for it: a string of digits for a number
# (strict: never coerced), a boolean for a number (Python's bool is an int), a number for a string or a boolean.
EXPECTED = {int: "an integer", float: "a number", str: "a string", bool: "true or false", tuple: "a list",
            dict: "a table"}
WRONG = {int: ("12", True), float: ("12", True), str: (12,), bool: ("yes", 1), tuple: ("x",), dict: ("x",)}
# [[pools]] and [[notify.targets]]: a good entry first, then one with the wrong key (so the line says #2).
ENTRIES = {"pools": ({"name": "a", "cards": [0]}, {"name": "b", "cards": [1]}),
           "projects": ({"name": "a", "members": ["alice"]}, {"name": "b", "members": ["bob"]}),
           "models": ({"alias": "a", "model": "/m/a.gguf"}, {"alias": "b", "model": "/m/b.gguf"}),
           "notify": ({"type": "slack", "url": "https://hooks.example/a"}, {"type": "slack", "url": "https://hooks.example/b"})}


def _plain(kind):
    """int for int | None, tuple for tuple[str, ...], dict for dict[int, float]."""
    if isinstance(kind, types.UnionType):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    return typing.get_origin(kind) or kind


def _keys(section):
    """(key, its plain type) of a section Struct, as the file may write them (the loader's own _fields are not; a
    renamed field by its file name: [[models]] class)."""
    return [(field.encode_name, _plain(field.type)) for field in msgspec.structs.fields(section)
            if not field.name.startswith("_")]


def _toml(value) -> str:
    return json.dumps(value)  # TOML writes these values (numbers, true, strings, lists of them) as JSON does


def _wrong_key_cases():
    """One case per key of every section and array of tables, from the Structs themselves: a key added later is in."""
    for name, kind in typing.get_type_hints(ConfigFile).items():
        words = "a table" if _is_section(kind) else EXPECTED[_plain(kind)]
        yield pytest.param(f"{name} = 3\n", f"[{name}]: expected {words}, got 3", id=f"{name}=3")
        if _plain(kind) is tuple:  # [[pools]]
            entry = typing.get_args(kind)[0]
            for key, plain in _keys(entry):
                for value in [12] if _is_section(plain) else WRONG[plain]:  # [models.preload]: a table
                    good, bad = (dict(e) for e in ENTRIES[name])
                    bad[key] = value
                    text = "".join(f"[[{name}]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in e.items()) for e in (good, bad))
                    expected = "a table" if _is_section(plain) else EXPECTED[plain]
                    yield pytest.param(text, f"[[{name}]] #2 {key}: expected {expected}, got {_toml(value)}",
                                       id=f"{name}.{key}={value!r}")
        elif _plain(kind) is dict:  # [labels], [classes]: their values
            plain = _plain(typing.get_args(kind)[1])
            for value in WRONG[plain]:
                key = "0" if typing.get_args(kind)[0] is int else "online"
                yield pytest.param(f"[{name}]\n{key} = {_toml(value)}\n",
                                   f"[{name}] {key}: expected {EXPECTED[plain]}, got {_toml(value)}", id=f"{name}.{key}")
        else:
            for key, plain in _keys(kind):
                if plain is tuple and _is_section(typing.get_args(typing.get_type_hints(kind)[key])[0]):
                    entry = typing.get_args(typing.get_type_hints(kind)[key])[0]  # [[notify.targets]]
                    for field, field_plain in _keys(entry):
                        for value in WRONG[field_plain]:
                            good, bad = (dict(e) for e in ENTRIES[name])
                            bad[field] = value
                            text = "".join(f"[[{name}.{key}]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in e.items())
                                           for e in (good, bad))
                            shown = _toml(value) if field != "url" else "12"
                            yield pytest.param(text, f"[[{name}.{key}]] #2 {field}: expected {EXPECTED[field_plain]},"
                                               f" got {shown}", id=f"{name}.{key}.{field}={value!r}")
                    continue
                for value in WRONG[plain]:
                    yield pytest.param(f"[{name}]\n{key} = {_toml(value)}\n",
                                       f"[{name}] {key}: expected {EXPECTED[plain]}, got {_toml(value)}",
                                       id=f"{name}.{key}={value!r}")


def _is_section(kind) -> bool:
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def board_status(tmp_path, monkeypatch, capsys, text: str) -> tuple[int, str]:
    """`board status --demo` on a config holding `text`, in this process: (exit code, stderr)."""
    path = tmp_path / "board.toml"
    path.write_text(text)
    for name in ("BOARD_DB", "BOARD_DB_URL", "BOARD_SIMULATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BOARD_CONFIG", str(path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # where the demo's database would be made
    code = main(["status", "--demo"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("text, line", list(_wrong_key_cases()))
def test_a_wrong_type_in_any_key_is_exit_2_and_one_line(tmp_path, monkeypatch, capsys, text, line):
    """Every key of every section, through the real command line; nothing written. Nearest wrong versions: a key
    not typed (Any), a string of digits coerced to a number (convert without strict), a boolean taken as a number,
    the section or the entry left out of the line ([[pools]] without its #2), the value left out."""
    code, err = board_status(tmp_path, monkeypatch, capsys, text)
    assert (code, err) == (2, f"board: bad config {tmp_path / 'board.toml'}: {line}\n")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["board.toml"]


def test_every_section_and_key_has_a_case():
    """The cases come from the Structs: each section of ConfigFile, and each of its keys, is in one."""
    ids = " ".join(case.id for case in _wrong_key_cases())
    for name, kind in typing.get_type_hints(ConfigFile).items():
        assert f"{name}=3" in ids
        entry = typing.get_args(kind)[0] if _plain(kind) is tuple else kind
        for key, _ in _keys(entry) if _is_section(entry) else ():
            assert f"{name}.{key}" in ids
    assert len(ids.split()) > 150


@pytest.mark.parametrize("text, line", [
    ('[policy]\nmax_booking_hours = "12"\n', '[policy] max_booking_hours: expected a number, got "12"'),
    ('[policy]\nmax_cards_per_user = 8.0\n', "[policy] max_cards_per_user: expected an integer, got 8.0"),
    ('[[pools]]\nname = "a"\ncards = [0, "1"]\n', '[[pools]] #1 cards[1]: expected an integer, got "1"'),
    ('[[pools]]\nname = "a"\n', "[[pools]] #1: cards is required"),
    ('[[pools]]\nname = "a"\ncards = [0]\n[pools.windows]\nfinetune = { hours = 9 }\n',
     "[[pools]] #1 windows.finetune.hours: expected a string, got 9"),
    ('[[pools]]\nname = "a"\ncards = [0]\n[pools.windows]\nfinetune = { hours = "19:00-09:00", weekends = "no" }\n',
     '[[pools]] #1 windows.finetune.weekends: expected true or false, got "no"'),
    ('[[pools]]\nname = "a"\ncards = [0]\n[pools.windows]\nfinetune = { hours = "19:00-09:00", weekend = true }\n',
     "unknown key 'weekend' in [[pools]] #1 windows.finetune; known keys: hours, weekends"),
    ('[[pools]]\nname = "a"\ncards = [0]\n[pools.windows]\nfinetune = { hours = "19:00" }\n',
     "[[pools]] #1 windows.finetune.hours is '19:00'; give local hours such as \"19:00-09:00\""),
    ('[labels]\nx = "slot A"\n', '[labels]: expected an integer for a key, got "x"'),
    ('[labels]\n0 = "slot A"\n1 = 2\n', "[labels] 1: expected a string, got 2"),
    ('[power.cards]\n1 = 450\nx = 450\n', '[power] cards: expected an integer for a key, got "x"'),
    ('[power.cards]\n1 = "450"\n', '[power] cards.1: expected a number, got "450"'),
    ('[gateway.team_aliases]\n"team llm" = ["alice", 3]\n', '[gateway] team_aliases."team llm"[1]: expected a string, got 3'),
    ('[classes]\nonline = ["alice"]\nbatch = [3]\n', "[classes] batch[0]: expected a string, got 3"),
    ('[[notify.targets]]\ntype = "slack"\nurl = ["https://hooks.example/SEKRIT"]\n',
     "[[notify.targets]] #1 url: expected a string, got a list"),
    ('[policy]\nnote = "' + "x" * 60 + '"\n', "unknown key 'note' in [policy]; known keys:"
     " fair_share_half_life_days, idle_release_after_min, idle_release_grace_min, idle_release_notice_min,"
     " idle_util_pct, max_ahead_days, max_booking_hours, max_cards_per_user, timezone"),
    ('[policy]\ntimezone = "' + "x" * 60 + '"\n', "[policy] timezone 'x" + "x" * 59 + "' is not a known time zone,"
     " such as 'Europe/Berlin'"),
    ('[llama]\nmodel_dirs = ["/models", "' + "m" * 60 + '"]\nallowed_hosts = "' + "h" * 60 + '"\n',
     '[llama] allowed_hosts: expected a list, got "' + "h" * 36 + "..."),
])
def test_the_line_names_where_in_the_file(tmp_path, monkeypatch, capsys, text, line):
    """Entries of arrays of tables by number, items of lists by index, keys of tables by name, long values cut, a
    notify url never shown. Nearest wrong versions: the index from 0 ([[pools]] #0), the dict's key unnamed
    ([labels] ...), the url's value printed, the whole long value printed."""
    code, err = board_status(tmp_path, monkeypatch, capsys, text)
    assert (code, err) == (2, f"board: bad config {tmp_path / 'board.toml'}: {line}\n")
    assert "SEKRIT" not in err


_A = '[[projects]]\nname = "a"\nmembers = ["alice"]\n'
_POOL = '[[pools]]\nname = "tp4"\ncards = [4, 5, 6, 7]\n'


@pytest.mark.parametrize("text, line", [
    (_A + _A, "[[projects]] #2 name 'a' is #1's too; give each project its own name"),
    ('[[projects]]\nname = "a"\nmembers = ["alice"]\nclasses = ["online", "vip"]\n',
     "[[projects]] #1 (a) classes: 'vip' is not a class; name one or more of online, batch, finetune, experiment"),
    ('[[projects]]\nname = "a"\nmembers = ["alice"]\nclasses = []\n',
     "[[projects]] #1 (a) classes: empty is not a class; name one or more of online, batch, finetune, experiment"),
    ('[[projects]]\nname = "a"\nmembers = []\n', "[[projects]] #1 (a) members is []; give a list of user names and"
     ' @groups, such as ["alice", "@ml"]'),
    ('[[projects]]\nname = "a"\nmembers = ["al ice"]\n', "[[projects]] #1 (a) members is ['al ice']; give a list"),
    ('[[projects]]\nname = "a"\nmembers = ["@"]\n', "[[projects]] #1 (a) members is ['@']; give a list"),
    (_A + 'period = "day"\n', "[[projects]] #1 (a) period is 'day'; use \"month\" or \"week\""),
    (_A + 'period = "Month"\n', "[[projects]] #1 (a) period is 'Month'; use \"month\" or \"week\""),
    (_A + "gpu_hours = 0\n", "[[projects]] #1 (a) gpu_hours must be a number more than 0, not 0"),
    (_A + "gpu_hours = -5.0\n", "[[projects]] #1 (a) gpu_hours must be a number more than 0, not -5.0"),
    (_A + "gpu_hours = nan\n", "[[projects]] #1 (a) gpu_hours must be a number more than 0, not nan"),
    (_A + "gpu_hours = inf\n", "[[projects]] #1 (a) gpu_hours must be a number more than 0, not inf"),
    (_A + "share = 0.0\n", "[[projects]] #1 (a) share must be a number more than 0, not 0.0"),
    (_A + "share = inf\n", "[[projects]] #1 (a) share must be a number more than 0, not inf"),
    (_A + "tokens_per_day = 0\n", "[[projects]] #1 (a) tokens_per_day must be a number more than 0, not 0"),
    (_A + "rpm = -1\n", "[[projects]] #1 (a) rpm must be a number more than 0, not -1"),
    (_A + "tpm = 0\n", "[[projects]] #1 (a) tpm must be a number more than 0, not 0"),
    (_POOL + _A + '[[projects.allocations]]\ncards = [4]\npool = "tp4"\n',
     "[[projects]] #1 (a) allocations[0]: give cards or a pool, not both"),
    (_A + '[[projects.allocations]]\nhours = "09:00-19:00"\n',
     "[[projects]] #1 (a) allocations[0]: give cards or a pool, one of them"),
    (_POOL + _A + '[[projects.allocations]]\npool = "tp4"\n[[projects.allocations]]\npool = "tp8"\n',
     "[[projects]] #1 (a) allocations[1].pool 'tp8' is not a [[pools]] name; the pools are tp4"),
    (_A + '[[projects.allocations]]\npool = "tp4"\n',
     "[[projects]] #1 (a) allocations[0].pool 'tp4' is not a [[pools]] name; there are no [[pools]]"),
    (_A + '[[projects.allocations]]\ncards = [-1]\n', "[[projects]] #1 (a) allocations[0].cards are card numbers"),
    *[(_A + f'[[projects.allocations]]\ncards = [4]\nhours = "{hours}"\n',
       f"[[projects]] #1 (a) allocations[0].hours is '{hours}'; give local hours such as \"09:00-19:00\" or"
       " \"19:00-09:00\"") for hours in ("25:00-09:00", "9-17", "09:00", "24:00-09:00", "09:60-10:00")],
    *[(_A + f'[[projects.allocations]]\ncards = [4]\ndays = "{days}"\n',
       f"[[projects]] #1 (a) allocations[0].days is '{days}'; give days such as \"mon-fri\" or \"sat,sun\"")
      for days in ("monday", "mon-", "", "mon;tue")],
    ('[[projects]]\nname = "\\u001b[31mred"\nmembers = ["alice"]\n',
     "[[projects]] #1 name is '\\x1b[31mred'; give 1 to 40 letters, digits, '-', '_' or '.', starting with a letter"
     " or digit"),
    ('[[projects]]\nname = "[bold]x[/bold]"\nmembers = ["alice"]\n', "[[projects]] #1 name is '[bold]x[/bold]';"),
    ('[[projects]]\nname = ""\nmembers = ["alice"]\n', "[[projects]] #1 name is ''; give 1 to 40"),
    ('[[projects]]\nname = "-x"\nmembers = ["alice"]\n', "[[projects]] #1 name is '-x'; give 1 to 40"),
    ('[[projects]]\nname = "' + "p" * 41 + '"\nmembers = ["alice"]\n', "[[projects]] #1 name is '" + "p" * 40 + "';"),
    # What a type says, the generic path's words, in the same notation (an allocation by its index from 0).
    (_A + '[[projects.allocations]]\ncards = [4]\nhour = "09:00-10:00"\n',
     "unknown key 'hour' in [[projects]] #1 allocations[0]; known keys: cards, days, hours, pool"),
    (_A + '[[projects.allocations]]\ncards = "4"\n', '[[projects]] #1 allocations[0].cards: expected a list, got "4"'),
    ('[[projects]]\nmembers = ["alice"]\n', "[[projects]] #1: name is required"),
    # Two projects holding one card in hours that meet: each would refuse the other's members there.
    (_A + '[[projects.allocations]]\ncards = [4, 5]\nhours = "09:00-19:00"\ndays = "mon-fri"\n'
     '[[projects]]\nname = "b"\nmembers = ["bob"]\n[[projects.allocations]]\ncards = [5, 6]\nhours = "18:00-20:00"\n'
     'days = "fri"\n', "[[projects]] #2 (b) allocations[0] holds cards 5 in hours that [[projects]] #1 (a) allocations"
     "[0] holds them too; give each card to one project at a time"),
    (_POOL + _A + '[[projects.allocations]]\ncards = [7]\nhours = "22:00-02:00"\ndays = "sun"\n'
     '[[projects]]\nname = "b"\nmembers = ["bob"]\n[[projects.allocations]]\npool = "tp4"\nhours = "01:00-03:00"\n'
     'days = "mon"\n', "[[projects]] #2 (b) allocations[0] holds cards 7 in hours that [[projects]] #1 (a)"
     " allocations[0] holds them too"),  # Sunday night into Monday: across the week's end
])
def test_a_bad_project_is_one_line_naming_the_entry_and_the_key(tmp_path, monkeypatch, capsys, text, line):
    """The real command line, exit 2, nothing written. Nearest wrong versions: a duplicate name taken (--project
    would pick the first), an unknown class or pool taken, an allocation with both cards and a pool (or neither)
    taken, hours past 24:00 or a start of 24:00 taken, a budget of 0, NaN or inf taken (NaN passes `value <= 0`),
    a name with an escape printed raw, two projects holding one card at once, the entry's number left out."""
    code, err = board_status(tmp_path, monkeypatch, capsys, text)
    prefix = f"board: bad config {tmp_path / 'board.toml'}: "
    assert code == 2 and err.startswith(prefix + line) and err.count("\n") == 1 and "\x1b" not in err, err
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["board.toml"]


def test_projects_that_share_a_card_at_different_hours_or_days_load(tmp_path):
    """The nearest wrong version of the overlap check: any shared card refused, whatever the hours."""
    text = (_A + '[[projects.allocations]]\ncards = [4, 5]\nhours = "09:00-19:00"\ndays = "mon-fri"\n'
            '[[projects]]\nname = "b"\nmembers = ["bob"]\n[[projects.allocations]]\ncards = [4, 5]\n'
            'hours = "19:00-09:00"\ndays = "mon-fri"\n[[projects.allocations]]\ncards = [5]\ndays = "sat,sun"\n')
    path = tmp_path / "board.toml"
    path.write_text(text)
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    assert [p.name for p in config.projects] == ["a", "b"] and len(config.projects[1].allocations) == 2
