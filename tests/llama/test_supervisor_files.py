"""What the supervisor hands to llama-server: its key through a pipe, and each file flag's file as /dev/fd/N
of a file it opened and checked (app.llama.supervisor._hand_over). Pure: no llama-server here; the real one
reads them in tests/llama/test_servers.py and tests/llama/test_servers_service.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.llama import supervisor

BOARD_LINE = ["/bin/llama-server", "-m", "/srv/models/m.gguf", "--host", "127.0.0.1", "--port", "8081", "-c", "256",
              "-np", "1", "-ngl", "999", "--split-mode", "layer", "-fa", "on", "-ctk", "f16", "-ctv", "f16", "-lv", "4"]


@pytest.fixture
def models(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "t.jinja").write_text("{{ messages }}")
    (tmp_path / "secret.key").write_text("alice's key\n")
    return models


def _read(fd: int) -> str:
    with open(f"/dev/fd/{fd}") as f:  # as llama.cpp's ifstream opens it
        return f.read()


def test_the_key_goes_through_a_pipe_closed_for_writing():
    fd = supervisor._key_pipe("k" * 43)
    try:
        assert _read(fd) == "k" * 43 + "\n"  # read to its end: no writer left, so no hang
    finally:
        os.close(fd)


def test_a_file_under_model_dirs_is_handed_over_as_the_descriptor_of_the_file_checked(models):
    line, fds = supervisor._hand_over([*BOARD_LINE, "--temp", "0.1", "--chat-template-file", str(models / "t.jinja")],
                                      [str(models)])
    try:
        assert line[:-1] == [*BOARD_LINE, "--temp", "0.1", "--chat-template-file"]
        assert line[-1] == f"/dev/fd/{fds[0]}" and len(fds) == 1
        (models / "t.jinja").unlink()  # swapped after the check: llama-server still reads the file checked
        (models / "t.jinja").symlink_to(models.parent / "secret.key")
        assert _read(fds[0]) == "{{ messages }}"
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("case", ["symlink out", "symlinked dir out", "fifo", "directory", "missing", "sibling"])
def test_a_file_that_does_not_really_lie_under_model_dirs_is_refused(models, case):
    path = models / "x.jinja"
    if case == "symlink out":  # the attack's next step: a name under model_dirs that points at a key
        path.symlink_to(models.parent / "secret.key")
    elif case == "symlinked dir out":
        (models / "d").symlink_to(models.parent)
        path = models / "d" / "secret.key"
    elif case == "fifo":  # must not hang the launch either
        os.mkfifo(path)
    elif case == "directory":
        path.mkdir()
    elif case == "sibling":
        sibling = models.parent / "models-other"
        sibling.mkdir()
        path = sibling / "t.jinja"
        path.write_text("x")
    with pytest.raises(supervisor._Refused) as refused:
        supervisor._hand_over([*BOARD_LINE, "--chat-template-file", str(path)], [str(models)])
    assert str(refused.value).startswith("extra argument --chat-template-file")
    assert _open_under(models.parent) == []  # nothing it opened is left open


def _open_under(root: Path) -> list[str]:
    """What this process holds open under `root`. By what each descriptor names, not by counting them: in an xdist
    worker, earlier tests' sockets may be closed (or others opened) by other threads and the collector meanwhile."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile, or the listing's own descriptor
            continue
        if target == str(root) or target.startswith(f"{root}/"):
            found.append(target)
    return found


def test_model_dirs_are_resolved_too(tmp_path, models):
    link = tmp_path / "models-link"  # [llama] model_dirs may itself be a symlink
    link.symlink_to(models)
    line, fds = supervisor._hand_over([*BOARD_LINE, "--lora", str(link / "t.jinja")], [str(link)])
    assert line[-1] == f"/dev/fd/{fds[0]}"
    os.close(fds[0])


@pytest.mark.parametrize("extra", [["--log-file", "/tmp/x"], ["--api-key-file", "/tmp/k"], ["--temp"]])
def test_a_command_line_off_the_allow_list_is_not_started(models, extra):
    with pytest.raises(supervisor._Refused, match=f"extra argument {extra[0]}"):
        supervisor._hand_over([*BOARD_LINE, *extra], [str(models)])


def test_no_model_dirs_no_file(models):
    with pytest.raises(supervisor._Refused, match="none is configured"):
        supervisor._hand_over([*BOARD_LINE, "--lora", str(models / "t.jinja")], [])


def _help_table(llama_server: str) -> dict[str, int]:
    """Every flag `llama-server --help` lists, with the number of values it takes (0, 1, or 2 for START END)."""
    import re
    import subprocess

    text = subprocess.run([llama_server, "--help"], capture_output=True, text=True, timeout=60).stdout
    table = {}
    for line in text.splitlines():
        if not line.startswith("-"):
            continue
        head = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line), maxsplit=1)[0]
        *names, last = head.split(", ")
        flag, _, hint = last.partition(" ")
        count = 0 if not hint else 2 if hint == "START END" else 1
        for name in (*names, flag):
            table[name] = count
    return table


def test_the_allow_list_is_llama_servers_own_flags_with_their_values(llama_server):
    from app.llama import flags

    table = _help_table(llama_server)
    assert len(table) > 300  # the parse read the whole help
    wrong = {flag: (count, table.get(flag)) for flag, count in flags.PLAIN.items() if table.get(flag) != count}
    assert wrong == {}
    assert all(table.get(flag) == 1 for flag in flags.FILES | flags.BOARD)


def test_the_members_own_process_resolves_the_names_before_its_launch(models):
    from app.errors import BadInput
    from app.llama import command

    command.check_files([*BOARD_LINE, "--lora", str(models / "t.jinja")], [str(models)])
    (models / "x.jinja").symlink_to(models.parent / "secret.key")
    for path in (models / "x.jinja", models / "missing.jinja", models):
        with pytest.raises(BadInput, match=r"^extra argument --lora: .* is not a file under \[llama\] model_dirs"):
            command.check_files([*BOARD_LINE, "--lora", str(path)], [str(models)])


@pytest.mark.parametrize("spelling", ["--chat_template_file", "--json_schema_file", "--grammar_file"])
def test_a_file_flag_in_underscore_spelling_is_checked_as_the_file_flag_it_is(models, spelling):
    """llama.cpp reads `--chat_template_file` as `--chat-template-file`: the supervisor must too, or the path
    would reach llama-server unopened and unchecked.
    Wrong versions: the pair kept in the member's spelling (not in FILES: passed on as a path); `_` read as is."""
    canonical = spelling.replace("_", "-")
    with pytest.raises(supervisor._Refused, match=f"^extra argument {canonical}: "):
        supervisor._hand_over([*BOARD_LINE, spelling, str(models.parent / "secret.key")], [str(models)])
    line, fds = supervisor._hand_over([*BOARD_LINE, spelling, str(models / "t.jinja")], [str(models)])
    try:
        assert line[-2:] == [canonical, f"/dev/fd/{fds[0]}"] and _read(fds[0]) == "{{ messages }}"
    finally:
        for fd in fds:
            os.close(fd)


def test_a_models_directory_that_is_a_prefix_of_a_sibling_does_not_cover_it(models):
    """model_dirs /x/models, the file in /x/models-evil (a directory a member made beside it), with model_dirs
    given with and without a trailing slash.
    Wrong versions: a plain prefix test (`/x/models-evil/t` starts with `/x/models`); the slash stripped twice."""
    evil = models.parent / "models-evil"
    evil.mkdir()
    (evil / "t.jinja").write_text("x")
    for given in (str(models), str(models) + "/"):
        with pytest.raises(supervisor._Refused, match="is not a file under"):
            supervisor._hand_over([*BOARD_LINE, "--lora", str(evil / "t.jinja")], [given])
        line, fds = supervisor._hand_over([*BOARD_LINE, "--lora", str(models / "t.jinja")], [given])
        for fd in fds:
            os.close(fd)
    assert _open_under(models.parent) == []
