"""`board fit` as a user runs it: the real CLI in a subprocess on GGUF files written by tests/fit/shapes.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_board
from tests.fit import shapes

KEYS = {"model", "n_layer", "ctx", "parallel", "cache_type_k", "cache_type_v", "weights_mib", "kv_mib", "compute_mib",
        "host_mib", "options", "smallest_fit"}
CARD_KEYS = {"weights_mib", "kv_mib", "compute_mib", "overhead_mib", "total_mib"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fit-cli")
    paths = {name: shapes.write_model(directory / f"{name}.gguf", name) for name in ("tiny", "gqa8")}
    paths["mamba"] = shapes.write_model(directory / "ssm.gguf", shapes.Shape("ssm", arch="mamba"))
    (directory / "notes.gguf").write_text("not a model\n")
    paths["text"] = directory / "notes.gguf"
    paths["missing"] = directory / "gone.gguf"
    paths["directory"] = directory
    return paths


def fit_json(*args: str, env: dict | None = None) -> dict:
    result = run_board("fit", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def config(tmp_path, text: str) -> dict:
    path = tmp_path / "board.toml"
    path.write_text(text)
    return {"BOARD_CONFIG": str(path)}


def test_text_output_shows_the_four_options_and_the_smallest_fit(models, tmp_path):
    result = run_board("fit", str(models["tiny"]))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert str(models["tiny"]) in lines[0]
    rows = [line.split() for line in lines if line[:5].strip() in ("1", "2", "4", "8")]
    assert [row[0] for row in rows] == ["1", "2", "4", "8"]
    assert all("yes" in row for row in rows)
    assert "smallest fit: 1 card" in lines
    assert "book 1" in lines[-1]
    assert not any((tmp_path / "state").rglob("*"))  # an estimate writes nothing


def test_json_has_the_issues_shape(models):
    document = fit_json(str(models["gqa8"]), "--ctx", "1000", "-np", "3", "--cache-type-k", "q8_0",
                        "--cache-type-v", "q8_0", "--kv-unified")
    assert set(document) == KEYS
    assert (document["model"], document["n_layer"], document["ctx"], document["parallel"]) == (
        str(models["gqa8"]), 4, 1000, 3)
    assert (document["cache_type_k"], document["cache_type_v"]) == ("q8_0", "q8_0")
    assert [o["cards"] for o in document["options"]] == [1, 2, 4, 8]
    for option in document["options"]:
        assert set(option) == {"cards", "per_card", "fits"}
        assert len(option["per_card"]) == option["cards"]
        assert all(set(card) == CARD_KEYS for card in option["per_card"])
        assert option["fits"] is True
    assert document["smallest_fit"] == 1
    # unified: one stream of pad256(1000) = 1024 cells (3 streams of 512 if not), 4 layers x (272 + 272) bytes
    assert document["kv_mib"] == pytest.approx(1024 * 4 * 544 / 2**20, abs=0.05)
    kv_over_4 = sum(c["kv_mib"] for c in document["options"][2]["per_card"])
    assert kv_over_4 == pytest.approx(1024 * 4 * 544 / 2**20, abs=0.21)  # the same cache over 4 cards, each rounded


def test_the_options_change_the_estimate(models):
    base = fit_json(str(models["tiny"]), "--cards", "1")
    bigger = fit_json(str(models["tiny"]), "--cards", "1", "--ctx", "8192", "--flash-attn", "off")
    assert bigger["kv_mib"] == 2 * base["kv_mib"]
    assert bigger["compute_mib"] > base["compute_mib"]  # without flash attention the KQ matrix is materialised


def test_cards_gives_one_option_but_the_smallest_fit_of_all(models):
    document = fit_json(str(models["tiny"]), "--cards", "2")
    assert [o["cards"] for o in document["options"]] == [2]
    assert len(document["options"][0]["per_card"]) == 2
    assert document["smallest_fit"] == 1  # --cards picks the table's row, not the search
    result = run_board("fit", str(models["tiny"]), "--cards", "2")
    assert result.returncode == 0, result.stderr
    assert "smallest fit: 1 card" in result.stdout.splitlines()
    assert "book 1" in result.stdout.splitlines()[-1]


# app/config.py's _fit compares before it checks the type: "'<' not supported between instances of 'int' and 'str'"


class TestFitConfig:
    def test_fit_settings_are_used(self, models, tmp_path):
        env = config(tmp_path, "[fit]\ncard_mib = 1000\noverhead_mib = 600\nmax_fill = 0.5\n")
        document = fit_json(str(models["tiny"]), env=env)
        assert {c["overhead_mib"] for o in document["options"] for c in o["per_card"]} == {600}
        assert document["smallest_fit"] is None  # 600 MiB of overhead over a 500 MiB limit
        env = config(tmp_path, "[fit]\ncard_mib = 1000\noverhead_mib = 0\nmax_fill = 0.5\n")
        assert fit_json(str(models["tiny"]), env=env)["smallest_fit"] == 1

    def test_the_default_max_fill_is_90_percent_of_the_card(self, models, tmp_path):
        """No max_fill in [fit]: a card of just over total / 0.9 holds the model on one card, just under does not."""
        unbounded = config(tmp_path, "[fit]\ncard_mib = 100000\noverhead_mib = 0\n")
        total = fit_json(str(models["tiny"]), "--cards", "1", env=unbounded)["options"][0]["per_card"][0]["total_mib"]
        for card_mib, fits in ((total / 0.9 * 1.01, True), (total / 0.9 * 0.99, False)):
            env = config(tmp_path, f"[fit]\ncard_mib = {card_mib:.3f}\noverhead_mib = 0\n")
            assert fit_json(str(models["tiny"]), "--cards", "1", env=env)["options"][0]["fits"] is fits, card_mib

    @pytest.mark.parametrize("table", [
        "max_fill = 1.5", "max_fill = 0", "overhead_mib = -1", "card_mib = 0", "colour = 'blue'",
        "max_fill = 'lots'", "card_mib = 'big'", "overhead_mib = true",
    ])
    def test_a_bad_fit_setting_is_refused_naming_the_table(self, models, tmp_path, table):
        result = run_board("fit", str(models["tiny"]), env=config(tmp_path, f"[fit]\n{table}\n"))
        assert result.returncode == 2
        assert result.stdout == ""
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
        assert "[fit]" in result.stderr and table.split()[0] in result.stderr, result.stderr


BAD = [
    (("{missing}",), "no model file"),
    (("{text}",), "not a GGUF file"),
    (("{directory}",), "is a directory"),
    (("{mamba}",), "'mamba'"),
    (("{tiny}", "--ctx", "0"), "--ctx"),
    (("{tiny}", "--parallel", "0"), "--parallel"),
    (("{tiny}", "--cards", "3"), "--cards"),
    (("{tiny}", "--cache-type-k", "q3"), "--cache-type-k"),
    (("{tiny}", "--flash-attn", "maybe"), "--flash-attn"),
    (("{gqa8}", "--cache-type-v", "q8_0", "--flash-attn", "off"), "flash attention"),
    (("{tiny}", "--cache-type-k", "q4_0"), "head size"),
]


@pytest.mark.parametrize(("argv", "says"), BAD, ids=[" ".join(a) for a, _ in BAD])
@pytest.mark.parametrize("json_flag", [False, True], ids=["text", "json"])
def test_bad_input_is_one_line_and_exit_2(models, argv, says, json_flag):
    args = [a.format(**{k: str(v) for k, v in models.items()}) for a in argv] + (["--json"] if json_flag else [])
    result = run_board("fit", *args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert says in result.stderr


def test_fit_does_not_load_textual(models):
    code = (
        "import contextlib, io, sys\n"
        "from app.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    assert main(['fit', {str(models['tiny'])!r}, '--json']) == 0\n"
        "assert out.getvalue().startswith('{')\n"
        "print(' '.join(sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "gguf" in loaded  # it did read the model
    assert not loaded & {"textual", "rich", "sqlite_utils", "psutil", "pynvml"}
