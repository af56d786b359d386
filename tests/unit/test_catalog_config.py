"""[[models]] at config load (app.config._models): what the text alone says, the first bad entry in one line naming
`[[models]] #N (alias)` and the key, exit 2. llama.cpp's facts (its slot limit, cache types, the extra arguments'
allow-list), whether the file exists and fits the box are tests/unit/test_catalog_sizing.py's."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from app.config import ConfigError, load_config

BASE = """
[llama]
model_dirs = ["/srv/models", "/data/llm/"]
[[pools]]
name = "prod"
cards = [0, 1, 2, 3]
classes = ["online", "batch"]
[[pools]]
name = "lab"
cards = [4, 5]
"""

PROJECTS = """
[[projects]]
name = "search"
members = ["alice"]
classes = ["online", "batch"]
[[projects]]
name = "lab"
members = ["bob"]
classes = ["experiment"]
"""

GOOD = {"alias": "qwen-7b", "model": "/srv/models/qwen.gguf", "pool": "prod"}


def _toml(entry: dict) -> str:
    lines = ["[[models]]"]
    tables = []
    for key, value in entry.items():
        if isinstance(value, dict):  # preload
            tables += [f"[models.{key}]", *(f"{k} = {json.dumps(v)}" for k, v in value.items())]
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines + tables) + "\n"


def load(tmp_path, *entries: dict, projects: bool = False, extra: str = ""):
    path = tmp_path / "board.toml"
    path.write_text(BASE + (PROJECTS if projects else "") + extra + "".join(_toml(e) for e in entries))
    return load_config(environ={"BOARD_CONFIG": str(path)})


def refusal(tmp_path, *entries: dict, projects: bool = False, extra: str = "") -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, *entries, projects=projects, extra=extra)
    prefix = f"bad config {tmp_path / 'board.toml'}: "
    text = str(caught.value)
    assert text.startswith(prefix) and "\n" not in text
    return text.removeprefix(prefix)


def test_a_good_catalog_loads(tmp_path):
    """Every key set to an accepted value, two entries falling back on each other one way: it loads as written."""
    config = load(tmp_path, {**GOOD, "project": "search", "ctx": 8192, "parallel": 4, "cache_type_k": "q8_0",
                             "cache_type_v": "q8_0", "args": ["--temp", "0.7"], "class": "batch", "ttl_s": 0.5,
                             "preload": {"hours": "19:00-09:00", "days": "fri-mon"}, "fallbacks": ["small"]},
                  {"alias": "small", "model": "/data/llm/small.gguf", "project": "search"},
                  projects=True)
    first, second = config.models
    assert (first.alias, first.klass, first.ttl_s, first.preload.days, first.fallbacks) == (
        "qwen-7b", "batch", 0.5, "fri-mon", ("small",))
    assert (second.pool, second.project, second.klass) == (None, "search", "online")


CASES = [
    # (entries, projects, the line): each next to the nearest entry that loads (the comment).
    pytest.param([{**GOOD, "alias": ""}], False,
                 "[[models]] #1 alias is ''; give 1 to 200 printable characters, the name clients send as \"model\"",
                 id="alias-empty"),
    pytest.param([{**GOOD, "alias": "a" * 201}], False,  # 200 loads (test_the_alias_boundary)
                 f"[[models]] #1 alias is {'a' * 40!r}; give 1 to 200 printable characters, the name clients send as"
                 " \"model\"", id="alias-201"),
    pytest.param([{**GOOD, "alias": "qwen\n7b"}], False,
                 "[[models]] #1 alias is 'qwen\\n7b'; give 1 to 200 printable characters, the name clients send as"
                 " \"model\"", id="alias-control"),
    pytest.param([GOOD, {**GOOD, "model": "/srv/models/b.gguf"}], False,
                 "[[models]] #2 alias 'qwen-7b' is #1's too; give each entry its own alias", id="alias-twice"),
    pytest.param([{**GOOD, "alias": "team-llm"}], False,
                 "[[models]] #1 (team-llm) alias is a [gateway.team_aliases] name too, which members serve"
                 " themselves; give the catalog entry another alias", id="alias-team"),
    pytest.param([{**GOOD, "model": "srv/models/qwen.gguf"}], False,
                 "[[models]] #1 (qwen-7b) model is 'srv/models/qwen.gguf'; give the absolute path of a .gguf file",
                 id="model-relative"),
    pytest.param([{**GOOD, "model": "/srv/models/qwen.bin"}], False,
                 "[[models]] #1 (qwen-7b) model is '/srv/models/qwen.bin'; give the absolute path of a .gguf file",
                 id="model-not-gguf"),
    pytest.param([{**GOOD, "model": "/srv/models/../etc/qwen.gguf"}], False,
                 "[[models]] #1 (qwen-7b) model /srv/models/../etc/qwen.gguf is not under [llama] model_dirs"
                 " (/srv/models, /data/llm); put the file under one of them (without '..') or add its folder there",
                 id="model-dotdot"),
    pytest.param([{**GOOD, "model": "/srv/models/sub/../qwen.gguf"}], False,  # '..' that stays inside: refused too
                 "[[models]] #1 (qwen-7b) model /srv/models/sub/../qwen.gguf is not under [llama] model_dirs"
                 " (/srv/models, /data/llm); put the file under one of them (without '..') or add its folder there",
                 id="model-dotdot-inside"),
    pytest.param([{**GOOD, "model": "/srv/models-old/qwen.gguf"}], False,  # a folder's name as a prefix
                 "[[models]] #1 (qwen-7b) model /srv/models-old/qwen.gguf is not under [llama] model_dirs"
                 " (/srv/models, /data/llm); put the file under one of them (without '..') or add its folder there",
                 id="model-prefix"),
    pytest.param([{**GOOD, "ctx": 0}], False, "[[models]] #1 (qwen-7b) ctx must be a whole number more than 0, not 0",
                 id="ctx-0"),
    pytest.param([{**GOOD, "parallel": 0}], False,
                 "[[models]] #1 (qwen-7b) parallel must be a whole number more than 0, not 0", id="parallel-0"),
    pytest.param([{**GOOD, "ctx": 3, "parallel": 4}], False,  # ctx 4, parallel 4 loads
                 "[[models]] #1 (qwen-7b) parallel is 4, more than its ctx (3); give fewer slots or more ctx",
                 id="parallel-over-ctx"),
    pytest.param([{**GOOD, "class": "urgent"}], False,
                 "[[models]] #1 (qwen-7b) class is 'urgent'; use one of online, batch, finetune, experiment",
                 id="class-unknown"),
    pytest.param([{**GOOD, "pool": "gpu"}], False,
                 "[[models]] #1 (qwen-7b) pool 'gpu' is not a [[pools]] name; the pools are prod, lab", id="pool-unknown"),
    pytest.param([{**GOOD, "class": "finetune"}], False,  # lab allows it (test_a_pool_allows_its_classes)
                 "[[models]] #1 (qwen-7b) class finetune is not allowed in pool prod (it allows online, batch); give"
                 " another class or pool", id="pool-class"),
    pytest.param([GOOD], True,
                 "[[models]] #1 (qwen-7b) project is missing; name the project it is billed to, one of search, lab",
                 id="project-missing"),
    pytest.param([{**GOOD, "project": "serch"}], True,
                 "[[models]] #1 (qwen-7b) project names 'serch', not a [[projects]] name; name the project it is"
                 " billed to, one of search, lab", id="project-unknown"),
    pytest.param([{**GOOD, "pool": "lab", "project": "lab"}], True,  # lab may book experiment only
                 "[[models]] #1 (qwen-7b) class online is not one project lab may book (it may experiment); give"
                 " another class or project", id="project-class"),
    pytest.param([{**GOOD, "project": "search"}], False,
                 "[[models]] #1 (qwen-7b) project 'search': this board has no [[projects]]; leave project out",
                 id="project-without-projects"),
    pytest.param([{**GOOD, "ttl_s": 0}], False,
                 "[[models]] #1 (qwen-7b) ttl_s must be a number of seconds more than 0, not 0", id="ttl-0"),
    pytest.param([{**GOOD, "ttl_s": -5.0}], False,
                 "[[models]] #1 (qwen-7b) ttl_s must be a number of seconds more than 0, not -5", id="ttl-negative"),
    pytest.param([{**GOOD, "preload": {"hours": "9-17"}}], False,
                 "[[models]] #1 (qwen-7b) preload.hours is '9-17'; give local hours such as \"09:00-19:00\" or"
                 " \"19:00-09:00\"", id="preload-hours"),
    pytest.param([{**GOOD, "preload": {"days": "weekdays"}}], False,
                 "[[models]] #1 (qwen-7b) preload.days is 'weekdays'; give days such as \"mon-fri\" or \"sat,sun\"",
                 id="preload-days"),
    pytest.param([{**GOOD, "fallbacks": ["qwen-7b"]}], False,
                 "[[models]] #1 (qwen-7b) fallbacks names itself; name other [[models]] aliases", id="fallback-self"),
    pytest.param([{**GOOD, "fallbacks": ["small"]}], False,
                 "[[models]] #1 (qwen-7b) fallbacks: 'small' is not a [[models]] alias; name other entries of the"
                 " catalog (qwen-7b)", id="fallback-unknown"),
    pytest.param([{**GOOD, "fallbacks": ["b"]}, {**GOOD, "alias": "b", "fallbacks": ["c"]},
                  {**GOOD, "alias": "c", "fallbacks": ["b"]}], False,
                 "[[models]] #2 (b) fallbacks go round: b -> c -> b; drop one so that each chain ends",
                 id="fallback-cycle"),
]


@pytest.mark.parametrize("entries, projects, line", CASES)
def test_a_bad_entry_is_one_line_naming_it_and_the_key(tmp_path, entries, projects, line):
    """Nearest wrong versions, one a case: a rule dropped (each case then loads), the alias's bound moved (201
    taken), a path checked by prefix and not by folder (/srv/models-old), '..' resolved away instead of refused, a
    parallel equal to ctx refused, the pool's or the project's classes not consulted, a project taken on a board
    without [[projects]], a cycle's members unnamed."""
    assert refusal(tmp_path, *entries, projects=projects,
                   extra='[gateway.team_aliases]\nteam-llm = ["alice"]\n') == line


def test_the_boundaries_that_load(tmp_path):
    """The other side of each boundary above: a 200-character alias, parallel equal to ctx (and to llama.cpp's
    256), a trailing slash on a model_dirs folder, a pool that allows the class, a fallback chain that ends.
    Nearest wrong versions: `<` for `<=` on the alias or on parallel, the folder compared with its slash."""
    config = load(tmp_path, {**GOOD, "alias": "a" * 200, "ctx": 4, "parallel": 4, "fallbacks": ["b"]},
                  {"alias": "b", "model": "/data/llm/b.gguf", "ctx": 256, "parallel": 256, "fallbacks": ["c"]},
                  {"alias": "c", "model": "/srv/models/deep/c.gguf", "pool": "lab", "class": "finetune"})
    assert [m.alias for m in config.models] == ["a" * 200, "b", "c"]


def test_the_first_bad_entry_is_named(tmp_path):
    """Two bad entries: the line is the first's. Nearest wrong version: the last one checked wins."""
    assert refusal(tmp_path, GOOD, {**GOOD, "alias": "b", "ttl_s": 0}, {**GOOD, "alias": "c", "ctx": 0}) == (
        "[[models]] #2 (b) ttl_s must be a number of seconds more than 0, not 0")


def test_without_model_dirs_no_entry_loads(tmp_path):
    """No [llama] model_dirs: no folder holds a model. Nearest wrong version: an empty list taken as 'anywhere'."""
    path = tmp_path / "board.toml"
    path.write_text(_toml(GOOD).replace('pool = "prod"\n', ""))
    with pytest.raises(ConfigError, match=r"\[\[models\]\] #1 \(qwen-7b\) model /srv/models/qwen.gguf is not under"
                                          r" \[llama\] model_dirs \(none is set\)"):
        load_config(environ={"BOARD_CONFIG": str(path)})


def test_a_nan_ttl_is_refused(tmp_path):
    """TOML's nan and inf: no lease anyone can read. Nearest wrong version: `ttl_s <= 0` alone (nan passes it)."""
    for value in ("nan", "inf"):
        text = BASE + _toml(GOOD) + f"ttl_s = {value}\n"
        (tmp_path / "board.toml").write_text(text)
        with pytest.raises(ConfigError, match=rf"ttl_s must be a number of seconds more than 0, not {value}"):
            load_config(environ={"BOARD_CONFIG": str(tmp_path / "board.toml")})


def test_the_command_line_exits_2_with_the_line(tmp_path, monkeypatch, capsys):
    """Through the real `board status`: exit 2, the one line on stderr, nothing written (no database, no state)."""
    path = tmp_path / "board.toml"
    path.write_text(BASE + _toml({**GOOD, "fallbacks": ["qwen-7b"]}))
    for name in ("BOARD_DB", "BOARD_DB_URL", "BOARD_SIMULATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BOARD_CONFIG", str(path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code = main(["status", "--demo"])
    assert (code, capsys.readouterr().err) == (
        2, f"board: bad config {path}: [[models]] #1 (qwen-7b) fallbacks names itself; name other [[models]] aliases\n")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["board.toml"]
