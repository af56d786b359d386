"""The real `board agent` (as the unit runs it: user board, the simulated fleet of eight 32607 MiB cards) refuses to
start with a catalog ([[models]]) that cannot run on its box: one line per bad entry on stderr, exit 2, nothing
served and no database made. The lines themselves: tests/unit/test_catalog_sizing.py."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import run_board
from tests.llama.tiny_gguf import write_tiny_gguf
from tests.service.support import SERVICE_USER, Agent, check_reachable, ensure_system_user, needs_root
from tests.shared_install import scratch_dir

HUGE_CTX = 1 << 27  # the tiny model's KV cache alone outgrows eight RTX 5090s


@pytest.fixture
def agent():
    """The real service in a scratch directory user board can reach, not started; stopped and removed after."""
    needs_root()
    ensure_system_user()
    check_reachable(SERVICE_USER)
    root = scratch_dir("board-catalog-agent-")
    made = Agent(root)
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(root, ignore_errors=True)


def _catalog(agent, entries: list[dict]) -> None:
    """The agent's config with model_dirs = its models/ folder and these [[models]] entries."""
    agent.write_config()
    with open(agent.config, "a") as config:
        config.write(f"\n[llama]\nmodel_dirs = [{json.dumps(str(agent.root / 'models'))}]\n")
        for entry in entries:
            config.write("\n[[models]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items()))


def _models(agent) -> str:
    """models/ with a tiny model, readable by user board, and a link out of the folder to another."""
    folder = agent.root / "models"
    folder.mkdir()
    os.chmod(folder, 0o755)
    write_tiny_gguf(folder / "tiny.gguf")
    (agent.root / "elsewhere").mkdir()
    write_tiny_gguf(agent.root / "elsewhere" / "other.gguf")
    os.symlink(agent.root / "elsewhere" / "other.gguf", folder / "linked.gguf")
    for path in (folder / "tiny.gguf", agent.root / "elsewhere" / "other.gguf"):
        os.chmod(path, 0o644)
    return str(folder)


@pytest.mark.real_users
def test_the_agent_refuses_a_catalog_that_cannot_run_here(agent):
    """Three bad entries among good ones: three lines, in catalog order, exit 2; no socket, no database. Nearest wrong
    versions: the first bad entry only, the check after the socket is bound or the database made, a link out of
    model_dirs taken at its word, the fit not checked against the box's cards (the huge context)."""
    models = _models(agent)
    _catalog(agent, [
        {"alias": "tiny", "model": f"{models}/tiny.gguf"},
        {"alias": "missing", "model": f"{models}/none.gguf"},
        {"alias": "linked", "model": f"{models}/linked.gguf"},
        {"alias": "tiny-long", "model": f"{models}/tiny.gguf", "ctx": HUGE_CTX},
        {"alias": "tiny-2", "model": f"{models}/tiny.gguf", "ctx": 8192, "parallel": 4},
    ])
    agent.spawn()
    assert agent.proc.wait(60) == 2, agent.log_text()
    prefix = f"board: bad config {agent.config}: [[models]]"
    lines = [line for line in agent.log.read_text().splitlines() if line.startswith(prefix)]
    other = os.path.realpath(agent.root / "elsewhere" / "other.gguf")
    assert lines == [
        f"{prefix} #2 (missing): no model file {models}/none.gguf; put the file there or correct model",
        f"{prefix} #3 (linked): {models}/linked.gguf is {other} once symlinks are resolved, outside [llama]"
        f" model_dirs ({os.path.realpath(models)}); move the file or the link under them",
        f"{prefix} #4 (tiny-long): tiny.gguf with ctx {HUGE_CTX}, parallel 1 fits on no group of the 8 cards of this"
        " box (32607 MiB each); lower ctx or parallel, use a q8_0 cache or a smaller quantisation, or a pool with more"
        " cards (board fit shows the figures)",
    ], agent.log_text()
    assert "Traceback" not in agent.log_text()
    assert not agent.socket.exists() and not agent.db.exists()


@pytest.mark.real_users
def test_the_agent_serves_a_catalog_that_runs(agent):
    """The same box with the good entries alone: it starts and serves. Nearest wrong version: any catalog refused."""
    models = _models(agent)
    _catalog(agent, [{"alias": "tiny", "model": f"{models}/tiny.gguf"},
                     {"alias": "tiny-2", "model": f"{models}/tiny.gguf", "ctx": 8192, "parallel": 4}])
    agent.start()
    assert agent.answers()
    assert agent.stop() == 0, agent.log_text()


def test_doctor_shows_each_bad_entry_as_a_fix(tmp_path):
    """`board doctor` on the simulated fleet: each bad entry a FIX line (exit 1), a catalog that runs one ok line.
    Nearest wrong versions: the catalog not checked (exit 0), the lines shown as warnings."""
    folder = tmp_path / "models"
    folder.mkdir()
    write_tiny_gguf(folder / "tiny.gguf")
    config = tmp_path / "board.toml"
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC",
           "XDG_STATE_HOME": str(tmp_path / "state")}
    good = {"alias": "tiny", "model": f"{folder}/tiny.gguf"}
    bad = {"alias": "tiny-long", "model": f"{folder}/tiny.gguf", "ctx": HUGE_CTX}
    for entries in ([good, bad], [good]):
        config.write_text(f"[llama]\nmodel_dirs = [{json.dumps(str(folder))}]\n" + "".join(
            "\n[[models]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in e.items()) for e in entries))
        result = run_board("doctor", env=env)
        catalog = [line for line in result.stdout.splitlines() if "[[models]]" in line]
        if len(entries) == 2:
            assert catalog == [f"FIX   [[models]] #2 (tiny-long): tiny.gguf with ctx {HUGE_CTX}, parallel 1 fits on no"
                               " group of the 8 cards of this box (32607 MiB each); lower ctx or parallel, use a q8_0"
                               " cache or a smaller quantisation, or a pool with more cards (board fit shows the"
                               " figures)"], result.stdout
            assert result.returncode == 1
        else:
            assert catalog == ["ok    the catalog's 1 model(s) can run on this box's cards ([[models]])"], result.stdout
