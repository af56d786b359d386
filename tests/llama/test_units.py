"""The pure parts of app.llama: card order, command line, ports, logs, metrics, identity verdicts."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from app.config import LlamaSettings
from app.errors import BadInput
from app.gpu.model import LINK_MULTIPLE, LINK_SINGLE, LINK_SYSTEM, Topology
from app.llama import command, health, identity, logs, ports
from app.llama.binary import find_server_bin

TWO_SWITCHES = Topology({(a, b): LINK_MULTIPLE if (a < 4) == (b < 4) else LINK_SYSTEM
                         for a in range(8) for b in range(a + 1, 8)})


@pytest.mark.parametrize("cards, topology, expected", [
    ([0], TWO_SWITCHES, [0]),
    ([1, 0], TWO_SWITCHES, [0, 1]),
    ([7, 3, 4], TWO_SWITCHES, [3, 4, 7]),
    ([0, 4, 1, 5], TWO_SWITCHES, [0, 1, 4, 5]),
    ([6, 2, 5, 1], TWO_SWITCHES, [1, 2, 5, 6]),
    # 0-2 share a switch but 0-1 are closer still (one bridge): keep the closest pairs adjacent.
    ([0, 2, 1], Topology({(0, 1): LINK_SINGLE, (0, 2): LINK_MULTIPLE, (1, 2): LINK_MULTIPLE}), [0, 1, 2]),
    ([3, 0, 2], Topology({(0, 3): LINK_SINGLE}), [0, 3, 2]),
    ([2, 1], None, [1, 2]),
])
def test_topology_order_keeps_the_closest_cards_adjacent(cards, topology, expected):
    assert command.topology_order(cards, topology) == expected


def test_server_argv_is_the_recipe():
    argv = command.server_argv("/bin/llama-server", model="/m.gguf", host="127.0.0.1", port=8100, ctx=4096,
                               parallel=4, split_mode="layer", tensor_split="1,1", metrics=True, alias="m",
                               extra=["--temp", "0.2"], cache_types=("q8_0", "q4_0"), flash_attn="on")
    assert argv == ["/bin/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "8100", "-c", "4096",
                    "-np", "4", "-ngl", "999", "--split-mode", "layer", "-fa", "on", "-ctk", "q8_0", "-ctv", "q4_0",
                    "-lv", "4", "--tensor-split", "1,1", "--metrics",
                    "--alias", "m", "--temp", "0.2"]


def test_server_argv_by_default_splits_by_layer_with_flash_attention_and_an_f16_cache():
    argv = command.server_argv("/bin/llama-server", model="/m.gguf", host="127.0.0.1", port=8100, ctx=4096,
                               parallel=1)
    assert argv == ["/bin/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "8100", "-c", "4096",
                    "-np", "1", "-ngl", "999", "--split-mode", "layer", "-fa", "on", "-ctk", "f16", "-ctv", "f16",
                    "-lv", "4"]


def test_server_env_pins_the_cards_and_drops_llama_arg_variables():
    env = command.server_env(["GPU-a", "GPU-b"], {"PATH": "/bin", "LLAMA_ARG_HOST": "0.0.0.0",
                                                  "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                                                  # arg.cpp's options read from other names: a second key, a token
                                                  "LLAMA_API_KEY": "k", "HF_TOKEN": "t", "MTMD_BACKEND_DEVICE": "d",
                                                  "LLAMA_ARG_LOG_FILE": "/tmp/x"})
    assert env == {"PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
                   "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


def test_server_env_keeps_the_order_it_is_given_not_the_uuids_sorted():
    uuids = ["GPU-c0", "GPU-a2", "GPU-b3"]  # cards 0, 3, 2 in topology order; sorted they would read a2, b3, c0
    env = command.server_env(uuids, {})
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "GPU-c0,GPU-a2,GPU-b3"


def test_a_server_gets_each_cards_own_uuid_in_topology_order(tmp_path):
    """The booking's UUIDs follow the cards into topology order: neither index order nor UUID order."""
    from app.config import Config
    from app.core.identity import Identity
    from app.gpu.model import CardReading
    from app.llama.service import ServerService
    from app.service.rules.bookings import BookingService
    from app.store.db import connect
    from tests.conftest import FROZEN_NOW

    # Card 0 sits next to card 3; 2 is far from both. UUIDs sort as 2, 3, 0; indexes as 0, 2, 3.
    uuids = {0: "GPU-c000", 1: "GPU-d111", 2: "GPU-a222", 3: "GPU-b333"}
    topology = Topology({(0, 3): LINK_SINGLE})
    cards = [CardReading(index=i, uuid=u) for i, u in uuids.items()]
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config = Config(db_path=tmp_path / "board.db", llama=LlamaSettings(server_bin=str(binary)))
    me = Identity("alice", os.getuid(), False)
    conn = connect(config.db_path)
    try:
        booking = BookingService(conn, me, config, cards, topology, lambda: FROZEN_NOW).create(
            cards=[3, 2, 0], start=FROZEN_NOW, end=FROZEN_NOW + 3600)
        assert dict(zip(booking.cards, booking.card_uuids)) == {0: "GPU-c000", 2: "GPU-a222", 3: "GPU-b333"}
        server = ServerService(conn, me, config, topology=topology, clock=lambda: FROZEN_NOW, environ={}).prepare(
            booking.id, model="/models/m.gguf")
    finally:
        conn.close()
    assert list(server.cards) == [0, 3, 2]
    assert list(server.card_uuids) == ["GPU-c000", "GPU-b333", "GPU-a222"]
    assert command.server_env(server.card_uuids, {})["CUDA_VISIBLE_DEVICES"] == "GPU-c000,GPU-b333,GPU-a222"


# Every flag board sets itself, and what to use instead (None: board does not allow it at all).
_BOARD_SETS = {
    "-m": "--model", "--model": "--model", "--host": "--host", "--port": "--port", "-c": "--ctx", "--ctx-size": "--ctx",
    "-np": "--parallel", "--parallel": "--parallel", "-sm": "--split-mode", "--split-mode": "--split-mode",
    "-ts": "--tensor-split", "--tensor-split": "--tensor-split", "-a": "--alias", "--alias": "--alias",
    "--path": None, "--api-prefix": None, "-fa": "--flash-attn", "--flash-attn": "--flash-attn",
    "-ctk": "--cache-type-k", "--cache-type-k": "--cache-type-k", "-ctv": "--cache-type-v", "--cache-type-v": "--cache-type-v",
    "--api-key": None, "--api-key-file": None,  # each server has its own key, which the supervisor makes
}


@pytest.mark.parametrize("flag", list(_BOARD_SETS))
@pytest.mark.parametrize("spelling", ["apart", "joined"])
def test_extra_args_may_not_override_what_board_sets(flag, spelling):
    extra = ["--temp", "0.1", flag, "x"] if spelling == "apart" else ["--temp", "0.1", f"{flag}=x"]
    use = _BOARD_SETS[flag]
    hint = f"use board's {use} option instead" if use else "board does not allow it"
    with pytest.raises(BadInput) as refused:
        command.check_extra(extra)
    assert str(refused.value) == f"extra argument {flag} is set by board; {hint}"


_OTHER_MODELS = ["-mu", "--model-url", "-dr", "--docker-repo", "-hf", "-hfr", "-hff", "-hft", "-hfd", "-hfrd",
                 "--hf-repo", "--hf-file", "--hf-token", "--hf-repo-draft", "-md", "--model-draft",
                 "--spec-draft-model", "--spec-draft-hf", "--models-dir", "--models-preset"]


@pytest.mark.parametrize("flag", _OTHER_MODELS)
@pytest.mark.parametrize("spelling", ["apart", "joined"])
def test_extra_args_may_not_name_another_model_or_source(flag, spelling):
    extra = ["--temp", "0.1", flag, "x"] if spelling == "apart" else ["--temp", "0.1", f"{flag}=x"]
    with pytest.raises(BadInput) as refused:
        command.check_extra(extra)
    assert str(refused.value) == (f"extra argument {flag} names another model or model source; "
                                  "board serves only the model file given with --model")


@pytest.mark.parametrize("arg", ["--model=/models/lr=1e-4/m.gguf", "--model-url=https://host/get?file=m.gguf"])
def test_a_joined_flag_is_refused_even_when_its_value_holds_an_equals_sign(arg):
    with pytest.raises(BadInput, match=f"extra argument {arg.split('=')[0]} "):
        command.check_extra([arg])


def test_the_lists_above_are_every_flag_the_filter_knows():
    # A flag added to the filter gets a test here; one dropped from it fails the tests above.
    assert set(_BOARD_SETS) == set(command._MANAGED)
    assert set(_OTHER_MODELS) >= command._OTHER_MODEL
    assert all(any(flag.startswith(prefix) for flag in _OTHER_MODELS) for prefix in command._OTHER_MODEL_PREFIXES)


@pytest.mark.parametrize("extra", [
    ["--temp", "0.1", "-t", "8", "--jinja"], ["-mg", "0"], ["-cb"], ["-n", "16"], ["-ngl", "20"],
    ["--mmproj-offload"], ["--control-vector-layer-range", "1", "4"], ["--seed", "-1"],
    # a refused flag's text inside a value is not that flag: llama.cpp takes the next argument as the value
    ["--chat-template", "--port"], ["-r", "--log-file"],
])
def test_extra_args_on_the_allow_list_pass_through(extra):
    assert command.check_extra(extra) == extra


def test_extra_args_are_returned_in_llama_cpps_own_spelling():
    # arg.cpp replaces `_` by `-` in an argument that starts with `--`, so the check must read it the same way
    assert command.check_extra(["--top_k", "40", "--no_warmup"]) == ["--top-k", "40", "--no-warmup"]
    with pytest.raises(BadInput, match="extra argument --log-file is not one board passes"):
        command.check_extra(["--log_file", "/tmp/x"])


def test_every_underscore_of_a_flag_is_read_as_a_dash_a_file_flags_too():
    """llama.cpp replaces every `_` of a `--` argument, so `--chat_template_file` is the file flag and its path is
    checked as one; `-t_x` (one dash) is not renamed.
    Wrong versions: only the first `_` replaced (`--chat-template_file`: refused, or passed unchecked elsewhere);
    the pair returned in the member's spelling; one-dash flags renamed too."""
    dirs = ["/srv/models"]
    assert command.check_extra(["--chat_template_file", "/srv/models/t.jinja", "--no_kv_offload",
                                "--spec_ngram_mod_n_min", "2"], dirs) == [
        "--chat-template-file", "/srv/models/t.jinja", "--no-kv-offload", "--spec-ngram-mod-n-min", "2"]
    with pytest.raises(BadInput, match="^extra argument --json-schema-file takes one file under"):
        command.check_extra(["--json_schema_file", "/etc/shadow"], dirs)
    with pytest.raises(BadInput, match="^extra argument -n_gpu_layers is not one board passes"):
        command.check_extra(["-n_gpu_layers", "9"], dirs)


# The flags the review used (and their kin): each names a file, a directory or an address, or runs something.
_PATHS_AND_ADDRESSES = [
    "--log-file", "--slot-save-path", "--media-path", "--mmproj-url", "-mmu", "--log-prompts-dir", "--tools",
    "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json", "--ui-mcp-proxy", "-ag", "--agent", "--rpc",
    "--ssl-key-file", "--ssl-cert-file", "--ui-config-file", "--video-ffmpeg-dir", "-lcs", "--lookup-cache-static",
    "-lcd", "--lookup-cache-dynamic", "--lora-scaled", "--control-vector-scaled", "--reuse-port", "--cors-origins",
    "--fim-qwen-7b-default", "--gpt-oss-20b-default", "--mmproj-auto", "--props", "--list-devices", "--version",
    "-h", "--help", "--mlock", "-cd", "--api-keys", "positional",
]


@pytest.mark.parametrize("flag", _PATHS_AND_ADDRESSES)
def test_a_flag_off_the_allow_list_is_refused_in_one_line_naming_it(flag):
    with pytest.raises(BadInput) as refused:
        command.check_extra(["--temp", "0.1", flag, "/srv/models/x"], ["/srv/models"])
    message = str(refused.value)
    assert message.startswith(f"extra argument {flag} is not one board passes to llama-server") and "\n" not in message
    assert "docs/llama.md" in message


def test_no_flag_of_the_allow_list_takes_a_path_or_address():
    # the allow-list read from arg.cpp: none of these take a file, a directory or a URL
    from app.llama import flags

    for flag in ("--log-file", "--slot-save-path", "--media-path", "--mmproj-url", "--tools", "--rpc", "--lora",
                 "--chat-template-file", "--api-key-file", "--model", "-m", "--host", "--port", "--path"):
        assert flag not in flags.PLAIN, flag
    assert not flags.FILES & set(flags.PLAIN)
    assert not (flags.FILES | set(flags.PLAIN)) & (set(command._MANAGED) - {"--metrics"})


@pytest.mark.parametrize("flag", ["--chat-template-file", "--lora", "-mm", "--mmproj", "--control-vector",
                                  "--grammar-file", "-jf", "--json-schema-file"])
def test_a_file_flag_takes_a_file_under_model_dirs_only(flag):
    dirs = ["/srv/models", "/data/llm/"]
    assert command.check_extra([flag, "/srv/models/a/t.jinja"], dirs) == [flag, "/srv/models/a/t.jinja"]
    assert command.check_extra([flag, "/data/llm/t"], dirs) == [flag, "/data/llm/t"]
    for path in ("/var/lib/board-runner/board/servers/7.key",  # the attack: another server's key
                 "/var/lib/board-runner/board/servers/7.log",  # its log
                 "/srv/models",  # the directory itself, not a file under it
                 "/srv/models-other/t.jinja",  # a sibling that shares the prefix
                 "/srv/models/../x/t.jinja", "/srv/models/./t.jinja", "/srv//models/t",  # not normal
                 "srv/models/t.jinja", "models/t.jinja",  # relative
                 "/srv/models/a.gguf,/etc/shadow",  # llama.cpp splits --lora's value at commas
                 "/srv/models/t\n.jinja"):
        with pytest.raises(BadInput) as refused:
            command.check_extra([flag, path], dirs)
        assert str(refused.value).startswith(f"extra argument {flag} takes one file under [llama] model_dirs"), path
    with pytest.raises(BadInput, match="none is configured"):
        command.check_extra([flag, "/srv/models/t.jinja"], [])
    with pytest.raises(BadInput, match=f"extra argument {flag} needs a value"):
        command.check_extra(["--temp", "0.1", flag])


def test_a_joined_spelling_is_refused_with_the_spelling_llama_cpp_reads():
    # arg.cpp has no --flag=value: such an argument would stop llama-server at start; say so now
    with pytest.raises(BadInput) as refused:
        command.check_extra(["--temp=0.1"])
    assert str(refused.value) == "extra argument '--temp=0.1': llama-server reads no --flag=value spelling; write --temp 0.1"
    with pytest.raises(BadInput, match="write --chat-template-file /t/-m.jinja"):
        command.check_extra(["--chat-template-file=/t/-m.jinja"])


def test_a_joined_spelling_is_read_at_its_first_equals_sign_and_quoted_cut_to_80_and_60():
    """`--temp=a=b` is the flag --temp joined to the value `a=b`; a long argument is quoted to 80 characters and its
    value to 60; a joined flag off the allow-list gets the off-the-list refusal, not a hint to write it apart.
    Wrong versions: split at the last `=` (or at every `=`: a crash); other cuts; any `=` taken as a joined spelling."""
    with pytest.raises(BadInput) as refused:
        command.check_extra(["--temp=a=b"])
    assert str(refused.value) == "extra argument '--temp=a=b': llama-server reads no --flag=value spelling; write --temp a=b"
    long = "--top-k=" + "1234567890" * 10
    with pytest.raises(BadInput) as refused:
        command.check_extra([long])
    assert str(refused.value) == (f"extra argument {long[:80]!r}: llama-server reads no --flag=value spelling;"
                                  f" write --top-k {long[8:68]}")
    with pytest.raises(BadInput) as refused:
        command.check_extra(["--log-file=/etc/passwd"])
    assert str(refused.value).startswith("extra argument --log-file=/etc/passwd is not one board passes")


def test_a_flag_off_the_allow_list_is_refused_with_the_whole_hint_and_its_name_cut_to_80():
    """The refusal a member reads, word for word; a flag of 200 characters is named by its first 80.
    Wrong versions: another cut; the hint's wording or case changed."""
    flag = "--x" + "y" * 200
    with pytest.raises(BadInput) as refused:
        command.check_extra([flag])
    assert str(refused.value) == (
        f"extra argument {flag[:80]} is not one board passes to llama-server: only flags that name no file or address,"
        " and a file flag (--chat-template-file, --lora, --mmproj, ...) with a file under [llama] model_dirs;"
        " see 'Extra arguments' in docs/llama.md")


def test_a_flag_of_two_values_given_one_says_it_needs_two():
    """--control-vector-layer-range takes START END.
    Wrong version: every short flag told it 'needs a value'."""
    with pytest.raises(BadInput) as refused:
        command.check_extra(["--control-vector-layer-range", "1"])
    assert str(refused.value) == "extra argument --control-vector-layer-range needs 2 values"


def test_model_dirs_root_covers_every_file_and_a_dir_is_never_cut_short(tmp_path):
    """model_dirs `/` (normal, so it keeps its slash) covers every absolute file; a directory whose name ends in
    characters other than `/` keeps them.
    Wrong versions: the directory's trailing characters stripped as whitespace or as other characters than `/`."""
    assert command.check_extra(["--lora", "/srv/a.gguf"], ["/"]) == ["--lora", "/srv/a.gguf"]
    assert command.check_extra(["--lora", "/srv/models-X/a.gguf"], ["/srv/models-X"]) == ["--lora", "/srv/models-X/a.gguf"]
    with pytest.raises(BadInput, match="takes one file under"):
        command.check_extra(["--lora", "/srv/models-/a.gguf"], ["/srv/models-X"])
    lora = tmp_path / "a.gguf"
    lora.write_bytes(b"GGUF")
    command.check_files(["/bin/llama-server", "--lora", str(lora)], ["/"])


# The command line board itself writes (server_argv), which the member's own process and the supervisor read whole.
_BOARD_LINE = ["/bin/llama-server", "-m", "/srv/models/m.gguf", "--host", "127.0.0.1", "--port", "8081", "-c", "256",
               "-np", "1", "-ngl", "999", "--split-mode", "layer", "-fa", "on", "-ctk", "f16", "-ctv", "f16",
               "--tensor-split", "1,1", "--alias", "m", "-lv", "4"]


def test_the_whole_command_line_passes_with_boards_own_flags_and_nothing_else_does(tmp_path):
    """check_files reads board's own flags (one value each) and the allow-list; a hostile flag added to the line
    (--log-file, --api-key-file, --slot-save-path) is refused, and a flag of no value does not swallow the next.
    Wrong versions: board's flags refused, or every flag off board's list given one value (so --log-file passes)."""
    lora = tmp_path / "a.gguf"
    lora.write_bytes(b"GGUF")
    command.check_files([*_BOARD_LINE, "--jinja", "--lora", str(lora)], [str(tmp_path)])
    with pytest.raises(BadInput, match=r"^extra argument --lora: /etc/hostname is not a file under"):
        command.check_files([*_BOARD_LINE, "--jinja", "--lora", "/etc/hostname"], [str(tmp_path)])
    for hostile in (["--log-file", "/tmp/x"], ["--api-key-file", "/tmp/k"], ["--slot-save-path", "/tmp"]):
        with pytest.raises(BadInput, match=f"^extra argument {hostile[0]} is not one board passes"):
            command.check_files([*_BOARD_LINE, *hostile], [str(tmp_path)])


def test_a_cache_type_is_one_llama_server_knows_and_a_refusal_lists_them():
    assert [command.cache_type("k", name) for name in ("f16", "q8_0", "iq4_nl")] == ["f16", "q8_0", "iq4_nl"]
    with pytest.raises(BadInput) as refused:
        command.cache_type("v", "q" * 30)  # a long name is cut to 20 characters
    assert str(refused.value) == (f"--cache-type-v {'q' * 20!r} is not a cache type; use one of "
                                  "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl")


def test_check_model(tmp_path):
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert command.check_model(str(good)) == str(good.resolve())
    for path, message in ((tmp_path / "missing.gguf", "no model file"), (tmp_path, "not a file")):
        with pytest.raises(BadInput, match=message):
            command.check_model(str(path))
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"\x00" * 8)
    with pytest.raises(BadInput, match="not a GGUF file"):
        command.check_model(str(bad))


def test_check_model_says_why_it_cannot_read_the_path(tmp_path):
    # One line naming the path and the system's reason, not a traceback (here a name too long for the filesystem).
    path = str(tmp_path / ("m" * 300 + ".gguf"))
    with pytest.raises(BadInput) as refused:
        command.check_model(path)
    assert str(refused.value) == f"can't read the model {path}: File name too long"


def test_binary_lookup_order(tmp_path):
    first, second = tmp_path / "a" / "llama-server", tmp_path / "b" / "llama-server"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    assert find_server_bin(LlamaSettings(server_bin=str(first)), {"BOARD_LLAMA_SERVER": str(second)}) == str(first)
    assert find_server_bin(LlamaSettings(), {"BOARD_LLAMA_SERVER": str(second), "PATH": str(first.parent)}) == str(second)
    assert find_server_bin(LlamaSettings(), {"PATH": str(first.parent)}) == str(first)
    with pytest.raises(BadInput, match="make llama-server"):
        find_server_bin(LlamaSettings(), {"PATH": str(tmp_path)})
    with pytest.raises(BadInput, match="BOARD_LLAMA_SERVER names"):
        find_server_bin(LlamaSettings(), {"BOARD_LLAMA_SERVER": str(tmp_path / "nope")})


def test_ports_skip_leased_and_bound_ones():
    assert ports.candidates(8100, 8104, {8101, 8103}) == [8100, 8102, 8104]
    assert ports.candidates(8100, 8104, {8101}, wanted=8101) == []
    assert ports.candidates(8100, 8104, set(), wanted=8102) == [8102]
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        assert not ports.bind_free("127.0.0.1", holder.getsockname()[1])
    finally:
        holder.close()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    free = probe.getsockname()[1]
    probe.close()
    assert ports.bind_free("127.0.0.1", free)


def test_log_tail_and_follow(tmp_path):
    path = tmp_path / "1.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert logs.tail(str(path)) == [f"line {i}" for i in range(80, 100)]
    assert logs.tail(str(path), 3, max_bytes=30) == ["line 97", "line 98", "line 99"]
    assert logs.tail(str(tmp_path / "missing.log")) == []

    done = threading.Event()

    def writer():
        with open(path, "a") as f:
            for i in range(100, 103):
                time.sleep(0.05)
                f.write(f"line {i}\n")
                f.flush()
            f.write("partial")
        done.set()

    threading.Thread(target=writer).start()
    seen = list(logs.follow(str(path), start_lines=2, until=done.is_set, poll_s=0.01))
    assert seen == ["line 98", "line 99", "line 100", "line 101", "line 102", "partial"]


def test_log_dir_is_group_shared_in_a_setgid_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2770)
    path, fd = logs.open_log(shared / "servers", 7)
    os.close(fd)
    assert path == str(shared / "servers" / "7.log")
    assert oct((shared / "servers").stat().st_mode & 0o7777) == oct(0o2770)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o660)


def test_metrics_and_token_rate():
    rate = health.TokenRate()
    assert rate.update({"llamacpp:tokens_predicted_total": 100.0}, now=10.0) is None
    assert rate.update({"llamacpp:tokens_predicted_total": 150.0}, now=12.0) == 25.0
    assert rate.update(None, now=13.0) is None


def test_health_of_nothing_is_none():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    assert health.health("127.0.0.1", port, timeout=0.2) is None
    assert health.probe_host("0.0.0.0") == "127.0.0.1" and health.probe_host("::") == "::1"


def test_exit_info_and_group_members():
    assert identity.exit_info(-9) == (None, 9)
    assert identity.exit_info(3) == (3, None)
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert identity.group_members(sleeper.pid) == [sleeper.pid]
        me = identity.capture(sleeper.pid)
        assert identity.owns_group(sleeper.pid, [me])
        stranger = identity.ProcessIdentity(sleeper.pid, me.started - 5, me.cmdline)
        assert not identity.signal_group(sleeper.pid, 0, [stranger])  # a reused PID: not signalled
    finally:
        sleeper.kill()
        sleeper.wait()
    assert identity.group_members(sleeper.pid) == []


def test_the_service_takes_the_model_as_text_only():
    from app.llama.command import model_argument

    assert model_argument("/models/../models/tiny.gguf") == "/models/tiny.gguf"
    assert model_argument("/models/My Models/tiny q4.gguf") == "/models/My Models/tiny q4.gguf"  # spaces are fine
    for bad in ("/models/x\x1b[2J.gguf", "/models/x\x7f.gguf", "/models/x\n.gguf", "", None):
        with pytest.raises(BadInput) as refused:
            model_argument(bad)
        assert str(refused.value) == "give the model as a path to a .gguf file"
    with pytest.raises(BadInput) as refused:
        model_argument("tiny.gguf")
    assert str(refused.value) == "give the model's absolute path, not 'tiny.gguf'"
    # A long relative path is quoted only as far as its first 80 characters.
    with pytest.raises(BadInput) as refused:
        model_argument("models/" + "x" * 200 + ".gguf")
    assert str(refused.value) == "give the model's absolute path, not '" + "models/" + "x" * 73 + "'"
