from pathlib import Path

import pytest

from app.config import DEFAULT_DB_PATH, ConfigError, load_config

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
        ('[booking]\nnight_start = 19\n', "night_start is '19'"),
        ('[booking]\nnight_start = "\u0661\u0669:00"\n', "night_start is"),
        ('[booking]\nnight = "19:00"\n', "unknown key 'night' in \\[booking\\]; known keys: night_start"),
        ('[history]\nsample_s = 0\n', "\\[history\\] sample_s must be a number more than 0, not 0"),
        ('[history]\nraw_hours = "48"\n', "raw_hours must be a number more than 0"),
        ('[history]\nsample_s = 600\n', "sample_s is at most 300"),
        ('[history]\nenabled = "yes"\n', "enabled must be true or false"),
        ('[history]\nkeep_days = 3\n', "unknown key 'keep_days' in \\[history\\]"),
        ('[classes]\nvip = ["alice"]\n', "\\[classes\\] 'vip' is not a class; use one of online, batch, finetune, experiment"),
        ('[classes]\nonline = "alice"\n', "\\[classes\\] online is 'alice'; give a list of user names and @groups,"
                                         ' such as \\["@serving", "alice"\\]'),
        ('[classes]\nonline = ["alice", 3]\n', "\\[classes\\] online is \\['alice', 3\\]; give a list"),
        ('[classes]\nonline = ["@"]\n', "\\[classes\\] online is \\['@'\\]"),
        ('[classes]\nonline = ["al ice"]\n', "\\[classes\\] online is \\['al ice'\\]"),
        ('[classes]\nonline = ["a@b"]\n', "\\[classes\\] online is"),
        ('[[classes]]\nonline = ["alice"]\n', "\\[classes\\] is a table of class = \\[users and @groups\\]"),
        ('[gateway]\nmax_keys_per_user = 0\n', "\\[gateway\\] max_keys_per_user must be a number more than 0, not 0"),
        ('[gateway]\nmax_keys_per_user = 2.5\n', "\\[gateway\\] max_keys_per_user must be a whole number, not 2.5"),
        ('[gateway]\nmax_concurrent_per_user = "8"\n', "max_concurrent_per_user must be a number more than 0, not '8'"),
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
