"""Shell completion (app.cli.completion): the script `board completion bash|zsh` prints, loaded into a real bash (and
zsh), offers the commands, the flags of the real parser, the caller's live bookings from a real agent, card numbers
and the models under [llama] model_dirs; the words are data, and a TAB never prints an error.

Bash: the script sourced, COMP_WORDS/COMP_CWORD set as readline sets them, `_board` called, COMPREPLY read back.
Zsh (skipped where zsh is not installed: apt-get install zsh): the script sourced, the logic both shells share
(`_board_candidates`) called with the words, as the zsh front calls it from a completion widget.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.service.conftest import make_agent  # noqa: F401 - the real agent, as tests/service has it
from tests.service.support import BOARD, run_as

BIN = Path(sys.prefix) / "bin"  # this venv's: the script runs `command board` from the PATH
ENV = {"PATH": f"{BIN}:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "HOME": "/nonexistent"}

# The script sourced, the words as readline gives them (bash splits "--by=x" into "--by", "=", "x"), _board called;
# each word offered ends in NUL, so a word with a newline in it would show as one.
BASH = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _board; '
        'for w in "${COMPREPLY[@]}"; do printf "%s\\0" "$w"; done')
# compdef is compinit's: a stub, as the script registers itself with it when sourced.
ZSH = ('compdef() { :; }; source "$1"; shift; _board_candidates "${@[-1]}" "${(@)@[1,-2]}"; '
       'for w in "${_board_reply[@]}"; do printf "%s\\0" "$w"; done; [ "$_board_files" = 1 ] && printf "FILES\\0"; true')


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, Path]:
    """The scripts as the real `board completion SHELL` prints them, in a folder every user can read."""
    folder = tmp_path_factory.mktemp("completion")
    made = {}
    for shell in ("bash", "zsh"):
        printed = subprocess.run([str(BOARD), "completion", shell], capture_output=True, text=True, env=ENV, timeout=60)
        assert printed.returncode == 0 and not printed.stderr, printed.stderr
        made[shell] = folder / f"board.{shell}"
        made[shell].write_text(printed.stdout)
    return made


def offered(shell: str, script: Path, *words: str, env: dict | None = None, cwd: Path | None = None,
            user: str | None = None) -> list[str]:
    """The words the completion offers for `board WORDS...` (the last one the word being completed)."""
    if shell == "zsh" and shutil.which("zsh") is None:
        pytest.skip("zsh is not installed (apt-get install zsh)")
    argv = (["bash", "--norc", "--noprofile", "-c", BASH, "bash", str(script), "board", *words] if shell == "bash"
            else ["zsh", "-f", "-c", ZSH, "zsh", str(script), *words])
    if user is not None:
        done = run_as(user, *argv, env={**ENV, **(env or {})})
    else:
        done = subprocess.run(argv, capture_output=True, text=True, env={**ENV, **(env or {})}, cwd=cwd or "/",
                              timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # a TAB never writes to the terminal
    return done.stdout.split("\0")[:-1]


def options_of(parser, path: list[str]) -> list[str]:
    """The long options argparse itself takes after `board PATH`."""
    import argparse

    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


# -- commands and flags -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_bo_offers_book_and_a_word_of_two_commands_offers_both(scripts, shell):
    """Wrong versions: the table's commands not filtered by what was typed; only the first command that fits."""
    assert offered(shell, scripts[shell], "bo") == ["book"]
    assert offered(shell, scripts[shell], "se") == ["series", "serve"]
    assert offered(shell, scripts[shell], "serve", "st") == ["start", "stop"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_a_flag_after_book_dashes_is_every_long_option_of_the_real_parser(scripts, shell):
    """Every subcommand's options, as argparse has them (book's --model and --every are not in the quick path's
    table). Wrong versions: a list kept by hand; the root's options offered after a subcommand; options of the
    command before the last subcommand (serve's, not serve start's)."""
    from app.cli import build_parser

    parser = build_parser()
    for path in (["book"], ["serve", "start"], ["key", "new"], []):
        assert offered(shell, scripts[shell], *path, "--") == options_of(parser, path), path
    assert offered(shell, scripts[shell], "book", "--ca") == ["--cards", "--cache-type-k", "--cache-type-v"]


def test_a_flag_added_to_the_parser_is_completed_without_editing_the_script(tmp_path):
    """The table is made from the parser it is given. Wrong version: a table of flags written into the script."""
    from app.cli import build_parser
    from app.cli.completion import script

    parser = build_parser()
    for action in parser._actions:  # book's subparser, given a new option
        if action.__class__.__name__ == "_SubParsersAction":
            action.choices["book"].add_argument("--brand-new-flag", choices=("yes", "no"))
    path = tmp_path / "board.bash"
    path.write_text(script("bash", parser))
    assert offered("bash", path, "book", "--brand") == ["--brand-new-flag"]
    assert offered("bash", path, "book", "--brand-new-flag", "") == ["yes", "no"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_an_options_value_is_its_choices_and_the_next_word_after_a_value_is_not_taken_for_a_command(scripts, shell,
                                                                                                   tmp_path):
    """Wrong versions: a value read as a subcommand or positional (`--by card` then `c`); --by=c with the prefix
    lost (bash completes after the "=" it split at; zsh moves the prefix aside with compset)."""
    script = scripts[shell]
    assert offered(shell, script, "report", "--by", "c") == ["class", "card"]
    assert offered(shell, script, "serve", "start", "--flash-attn", "") == ["on", "off"]
    assert offered(shell, script, "fit", "--cards", "") == ["1", "2", "4", "8"]
    if shell == "bash":  # readline's words: "--by", "=", "c"; the word replaced is "c"
        assert offered(shell, script, "report", "--by", "=", "c") == ["class", "card"]
        assert offered(shell, script, "report", "--by=c") == ["--by=class", "--by=card"]  # no "=" in COMP_WORDBREAKS
    else:
        assert offered(shell, script, "report", "--by=c") == ["class", "card"]
    # A value taken, the next word is an option again; after `--`, a command's words are files.
    assert offered(shell, script, "report", "--by", "card", "--si") == ["--since"]
    assert offered(shell, script, "--db", "my.db", "st") == ["status"]  # my.db is --db's, not a command's word
    (tmp_path / "prog.py").write_text("")
    assert offered(shell, script, "run", "--booking", "3", "--", "pr", cwd=tmp_path) == (
        ["prog.py"] if shell == "bash" else ["FILES"])  # zsh: its own _files


def test_a_file_option_offers_the_shells_own_file_names(scripts, tmp_path):
    """Wrong version: file options completed as text (nothing)."""
    (tmp_path / "fleet.toml").write_text("")
    assert offered("bash", scripts["bash"], "--scenario", "fl", cwd=tmp_path) == ["fleet.toml"]


# -- models: the words are data ------------------------------------------------------------------------------------

HOSTILE = ("$(touch PWNED).gguf", "`touch PWNED`.gguf", "a;touch PWNED;.gguf", "'quoted\" $HOME *.gguf")


@pytest.fixture
def models(tmp_path) -> tuple[Path, dict]:
    """A model folder with plain, hostile and split names, and a config naming it in [llama] model_dirs."""
    folder = tmp_path / "models"
    (folder / "qwen").mkdir(parents=True)
    (folder / ".cache").mkdir()
    for name in ("llama-8b.gguf", *HOSTILE, "notes.txt", "new\nline.gguf", "qwen/q-00001-of-00002.gguf",
                 "qwen/q-00002-of-00002.gguf", ".cache/hidden.gguf"):
        (folder / name).write_text("")
    config = tmp_path / "board.toml"
    config.write_text(f'[llama]\nmodel_dirs = ["{folder}"]\n')
    return folder, {"BOARD_CONFIG": str(config)}


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_model_names_are_offered_as_they_are_and_nothing_in_them_runs(scripts, models, tmp_path, shell):
    """`$(...)`, backquotes and `;` in a file name are offered as text, and no PWNED file appears. Wrong versions:
    compgen -W with the words (it expands $(...) and backquotes); eval; a name with a newline offered as two words;
    a split model's later parts offered; hidden folders walked."""
    folder, env = models
    work = tmp_path / "work"
    work.mkdir()
    expected = sorted(str(folder / name) for name in ("llama-8b.gguf", *HOSTILE, "qwen/q-00001-of-00002.gguf"))
    assert offered(shell, scripts[shell], "serve", "start", "3", "--model", "", env=env, cwd=work) == expected
    assert offered(shell, scripts[shell], "fit", str(folder / "ll"), env=env, cwd=work) == [str(folder / "llama-8b.gguf")]
    assert offered(shell, scripts[shell], "book", f"--model={folder}/ll", env=env, cwd=work) == (
        [f"--model={folder}/llama-8b.gguf"] if shell == "bash" else [str(folder / "llama-8b.gguf")])
    assert not list(work.iterdir()) and not list(Path("/").glob("PWNED")) and not (folder / "PWNED").exists()


def test_a_model_outside_model_dirs_falls_back_to_the_file_names(scripts, models, tmp_path):
    """No model in model_dirs starts with ./: the shell's file names. Wrong version: nothing offered."""
    _, env = models
    (tmp_path / "mine.gguf").write_text("")
    assert offered("bash", scripts["bash"], "fit", "./mi", env=env, cwd=tmp_path) == ["./mine.gguf"]


# A real zsh completion widget: an interactive zsh on a pseudo-terminal (zsh/zpty), compinit with the script as
# _board on its fpath, a line typed and TAB pressed; what the terminal shows is read until the pattern appears.
ZPTY = r"""
zmodload zsh/zpty
zpty z "zsh -f -i"
zpty -w z "PS1='> '; fpath=($1 \$fpath); autoload -U compinit; compinit -u -D; print RE''ADY"
zpty -r z out '*READY*'
zpty -w -n z "$2"$'\t'
zpty -r z out "$3"
print -r -- "$out"
zpty -d z
"""


def zsh_widget(script: Path, typed: str, until: str, env: dict, cwd: Path) -> str:
    """What the terminal shows once TAB after `typed` has shown `until` (a zsh pattern)."""
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed (apt-get install zsh)")
    functions = cwd / "functions"
    functions.mkdir(exist_ok=True)
    shutil.copy(script, functions / "_board")
    done = subprocess.run(["zsh", "-f", "-c", ZPTY, "zsh", str(functions), typed, until], capture_output=True,
                          text=True, env={**ENV, "HOME": str(cwd), **env}, cwd=cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_zsh_completes_in_its_own_widget_and_quotes_a_hostile_name(scripts, tmp_path):
    """compadd puts a model's name on the line quoted, and nothing in it runs. Wrong versions: compadd -Q (the name
    unquoted: it would run when the line does); the autoloaded file only defining _board, never completing."""
    assert "board book" in zsh_widget(scripts["zsh"], "board bo", "*board book*", {}, tmp_path)
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "$(touch PWNED).gguf").write_text("")
    (tmp_path / "board.toml").write_text(f'[llama]\nmodel_dirs = ["{folder}"]\n')
    shown = zsh_widget(scripts["zsh"], f"board fit {folder}/", "*.gguf*", {"BOARD_CONFIG": str(tmp_path / "board.toml")},
                       tmp_path)
    assert "\\$\\(touch\\ PWNED\\).gguf" in shown, shown
    assert not list(tmp_path.rglob("PWNED"))


def bash_readline(script: Path, typed: str, until: bytes, env: dict, cwd: Path) -> str:
    """What the terminal shows once TAB after `typed` has shown `until`: an interactive bash on a pseudo-terminal,
    the script sourced, so that readline itself puts the word on the line (and quotes it, or not)."""
    import pty
    import select

    pid, terminal = pty.fork()
    if pid == 0:  # the child: bash, reading the terminal
        os.chdir(cwd)
        os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], {**ENV, "HOME": str(cwd), **env})
    shown, mark = b"", 0
    try:
        for line, wanted in ((f"PS1='> '; source {script}; echo RE''ADY\n", b"READY\r\n"), (typed + "\t", until)):
            os.write(terminal, line.encode())
            while wanted not in shown[mark:]:
                ready, _, _ = select.select([terminal], [], [], 60)
                assert ready, f"bash showed no {wanted!r}: {shown!r}"  # a bound against hanging, not a deadline
                shown += os.read(terminal, 4096)
            mark = shown.index(wanted, mark) + len(wanted)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(terminal)
    return shown.partition(b"READY\r\n")[2].decode(errors="replace")


def test_bash_puts_a_hostile_model_name_on_the_line_quoted(scripts, tmp_path):
    """Readline inserts the model's name as a file name, quoted, so that it stays text when the line runs. Wrong
    versions: compopt -o filenames left out for the models (the name lands raw: `$(touch PWNED).gguf`)."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "$(touch PWNED).gguf").write_text("")
    (tmp_path / "board.toml").write_text(f'[llama]\nmodel_dirs = ["{folder}"]\n')
    shown = bash_readline(scripts["bash"], f"board fit {folder}/", b".gguf", {"BOARD_CONFIG": str(tmp_path / "board.toml")},
                          tmp_path)
    assert "\\$\\(touch\\ PWNED\\).gguf" in shown, shown
    assert not list(tmp_path.rglob("PWNED"))


# -- the live words: through the service's socket, or nothing -----------------------------------------------------


class Stub:
    """A socket that answers each request line with `reply` (or, with reply None, never), recording the requests
    and the connections: to count the round trips of one TAB."""

    def __init__(self, path: Path, reply: dict | None) -> None:
        self.path, self.reply = path, reply
        self.requests: list[dict] = []
        self.connections = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn, conn.makefile("rb") as lines:
                for line in lines:
                    request = json.loads(line)
                    self.requests.append(request)
                    if self.reply is not None:
                        conn.sendall(json.dumps({"id": request["id"], "ok": True, "result": self.reply}).encode() + b"\n")


def socket_config(tmp_path: Path, path: Path) -> dict:
    config = tmp_path / "board.toml"
    config.write_text(f'[service]\nsocket = "{path}"\n')
    return {"BOARD_CONFIG": str(config)}


def test_ids_are_one_request_on_one_connection_and_the_quick_path_loads_no_parser(tmp_path):
    """Wrong versions: a `get` per booking, or `whoami` first; everyone's bookings (mine false); cancelled ones
    asked for; argparse or msgspec loaded for a TAB."""
    stub = Stub(tmp_path / "s.sock", {"bookings": [{"id": 41, "cards": [0]}, {"id": 7, "cards": [1]}]})
    env = {**ENV, **socket_config(tmp_path, stub.path)}
    code = ("import sys\nfrom app.quick import main\nrc = main(['__complete', 'bookings'])\n"
            "print(sorted(m for m in ('argparse', 'msgspec', 'tomllib', 'textual') if m in sys.modules), rc,"
            " file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout == "41\n7\n" and done.stderr == "[] 0\n", done.stderr
    assert stub.connections == 1 and len(stub.requests) == 1
    (request,) = stub.requests
    assert request["op"] == "list" and request["args"]["mine"] is True
    assert request["args"]["include_cancelled"] is False and request["args"]["end"] is None
    assert isinstance(request["args"]["start"], int)  # from now: live bookings


def test_an_unreachable_or_silent_service_offers_nothing_and_says_nothing(scripts, tmp_path):
    """No socket file, a socket nobody answers on, no config at all: no ids, exit 0, nothing on stderr.
    Wrong versions: the client's error (or a traceback) printed; the 30 s timeout of the CLI (a stuck service would
    hang the shell)."""
    gone = socket_config(tmp_path, tmp_path / "none.sock")
    assert offered("bash", scripts["bash"], "cancel", "", env=gone) == []
    for env in (gone, {"BOARD_CONFIG": str(tmp_path / "missing.toml")}):
        done = subprocess.run([str(BOARD), "__complete", "bookings"], capture_output=True, text=True,
                              env={**ENV, **env}, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    silent_dir = tmp_path / "silent"
    silent_dir.mkdir()
    Stub(silent_dir / "s.sock", None)
    silent = socket_config(silent_dir, silent_dir / "s.sock")
    done = subprocess.run([str(BOARD), "__complete", "cards"], capture_output=True, text=True,
                          env={**ENV, **silent}, timeout=20)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_an_unknown_live_word_is_bad_input():
    done = subprocess.run([str(BOARD), "__complete", "passwords"], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "board: __complete takes one of bookings, cards, models; the completion script asks it\n"


@pytest.mark.real_users
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_cancel_offers_the_members_own_live_bookings_from_the_real_agent(make_agent, scripts, shell):  # noqa: F811
    """alice and bob book through the real agent (as the unit runs it); each one's `cancel ` offers their own live
    bookings only, not the other's nor a cancelled one; `run --booking ` too; `book --cards 0,` the fleet's cards.
    Wrong versions: everyone's bookings (mine dropped); cancelled ones; ids not filtered by what was typed."""
    from tests.unix_users import MEMBERS_GROUP, ensure_unix_users

    ensure_unix_users()
    agent = make_agent(service={"group": MEMBERS_GROUP})
    env = {**ENV, "BOARD_CONFIG": str(agent.config)}

    def book(user: str, *args: str) -> int:
        done = run_as(user, str(BOARD), "book", "1", "--for", "1h", "--json", *args, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["id"]

    alice, gone, bob = book("alice"), book("alice", "--start", "+3h"), book("bob")
    assert run_as("alice", str(BOARD), "cancel", str(gone), env=env).returncode == 0
    script = agent.root / f"board.{shell}"  # the agent's scratch folder: every user may read it
    shutil.copy(scripts[shell], script)
    os.chmod(script, 0o644)
    assert offered(shell, script, "cancel", "", env=env, user="alice") == [str(alice)]
    assert offered(shell, script, "cancel", "", env=env, user="bob") == [str(bob)]
    assert offered(shell, script, "run", "--booking", "", env=env, user="alice") == [str(alice)]
    assert offered(shell, script, "cancel", str(alice), env=env, user="alice") == [str(alice)]
    assert offered(shell, script, "cancel", str(bob), env=env, user="alice") == []  # bob's is later: a longer id
    cards = offered(shell, script, "book", "--cards", "0,", env=env, user="alice")
    assert cards == [f"0,{n}" for n in range(len(cards))] and len(cards) >= 2

