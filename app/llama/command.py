"""The llama-server command line and environment: the seeds' recipe, hardened.

    CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=<booked UUIDs, topology order>
    llama-server -m MODEL.gguf --host 127.0.0.1 --port <leased> -c CTX -np SLOTS -ngl 999
      --split-mode layer -fa on -ctk f16 -ctv f16 -lv 4 [--tensor-split ...] [--metrics] [--alias NAME] [extra args]

`-lv 4` makes llama.cpp log each buffer it allocates at load (weights, KV cache, compute), which board reads back
as the server's measured memory (app.llama.memory). The price: each request logs more of the slot's doings
(about 26 lines per chat completion instead of 8 on build 11434), but nothing per token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.core.request import CACHE_TYPES
from app.errors import BadInput
from app.gpu.model import Topology
from app.llama import flags

SPLIT_MODES = ("layer", "row")
DEFAULT_CTX = 4096
DEFAULT_PARALLEL = 1

# Flags board sets itself: passing them again would bypass the port lease, the allowed hosts or the
# booked model, so extra args may not carry them (board's own options set them instead).
_MANAGED = {
    "-m": "--model", "--model": "--model", "--host": "--host", "--port": "--port",
    "-c": "--ctx", "--ctx-size": "--ctx", "-np": "--parallel", "--parallel": "--parallel",
    "-sm": "--split-mode", "--split-mode": "--split-mode", "-ts": "--tensor-split", "--tensor-split": "--tensor-split",
    "-a": "--alias", "--alias": "--alias", "--path": "(not allowed)", "--api-prefix": "(not allowed)",
    "-fa": "--flash-attn", "--flash-attn": "--flash-attn", "-ctk": "--cache-type-k", "--cache-type-k": "--cache-type-k",
    "-ctv": "--cache-type-v", "--cache-type-v": "--cache-type-v",
    "--api-key": "(not allowed)", "--api-key-file": "(not allowed)",  # each server has its own key (supervisor)
}

# Flags that load a model other than the booked file, or fetch one from elsewhere (a URL, Hugging Face,
# Docker Hub, a models directory the router serves from): the server would then run something board
# never checked. Every -hf... and --hf-... flag is one (repo, file, token, draft repo).
_OTHER_MODEL = {
    "-mu", "--model-url", "-dr", "--docker-repo", "-md", "--model-draft", "--spec-draft-model",
    "--spec-draft-hf", "--models-dir", "--models-preset",
}
_OTHER_MODEL_PREFIXES = ("-hf", "--hf-")


def topology_order(cards: Sequence[int], topology: Topology | None) -> list[int]:
    """The cards ordered so that the closest ones sit next to each other (seed 003, 5.2): llama.cpp
    splits layers in device order, so neighbours in CUDA_VISIBLE_DEVICES exchange activations.
    Greedy from the lowest index: the next card is the closest to the last one, ties by index."""
    remaining = sorted(set(cards))
    if not remaining or topology is None:
        return remaining
    order = [remaining.pop(0)]
    while remaining:
        last = order[-1]
        nearest = min(remaining, key=lambda c: (topology.level(last, c), c))
        remaining.remove(nearest)
        order.append(nearest)
    return order


def model_argument(path: str) -> str:
    """The model as the service takes it: an absolute, normal path, checked as text only.

    The service never opens a path a client sent; the member's own process checked the file
    (check_model) and its supervisor, running as the member, is what opens it."""
    if not isinstance(path, str) or not path or any(ord(c) < 32 or c == "\x7f" for c in path):
        raise BadInput("give the model as a path to a .gguf file")
    if not os.path.isabs(path):
        raise BadInput(f"give the model's absolute path, not {path[:80]!r}")
    return os.path.normpath(path)


def check_model(path: str) -> str:
    """The model's absolute path, or BadInput saying what is wrong with it: run by the member's own process."""
    model = Path(path).expanduser()
    try:
        if not model.exists():
            raise BadInput(f"no model file {path}")
        if not model.is_file():
            raise BadInput(f"{path} is not a file; give a .gguf model file")
        with open(model, "rb") as f:
            magic = f.read(4)
    except OSError as error:  # a directory on the way you may not enter, or a file you may not read
        raise BadInput(f"can't read the model {path}: {error.strerror}") from None
    if magic != b"GGUF":
        raise BadInput(f"{path} is not a GGUF file; llama-server needs a .gguf model")
    return str(model.resolve())


def check_extra(extra: Sequence[str], model_dirs: Sequence[str] = ()) -> list[str]:
    """The extra llama-server arguments in llama.cpp's own spelling, or BadInput naming the first flag that is
    not on the allow-list (app.llama.flags): one board sets itself, one that names another model, one that
    names a file or address; a file flag's value must be a file's absolute, normal path under `model_dirs`.

    Text only: the service never opens a path a client sent. Where the file really lies (symlinks resolved)
    is checked by the supervisor, which opens it and hands it to llama-server (app.llama.supervisor)."""
    try:
        pairs = flags.split(list(extra))
    except flags.Refused as refused:
        flag = refused.flag.split("=", 1)[0]
        if flag in _OTHER_MODEL or flag.startswith(_OTHER_MODEL_PREFIXES):
            raise BadInput(f"extra argument {flag} names another model or model source; "
                           "board serves only the model file given with --model") from None
        if flag in _MANAGED:
            use = _MANAGED[flag]
            hint = f"use board's {use} option instead" if use.startswith("--") else "board does not allow it"
            raise BadInput(f"extra argument {flag} is set by board; {hint}") from None
        raise BadInput(str(refused)) from None
    dirs = [os.path.normpath(d) for d in model_dirs if os.path.isabs(d)]
    checked = []
    for flag, values in pairs:
        if flag in flags.FILES:
            _file_argument(flag, values[0], dirs)
        checked += [flag, *values]
    return checked


def _file_argument(flag: str, path: str, dirs: list[str]) -> None:
    where = ", ".join(dirs) or "none configured"
    if not dirs:
        raise BadInput(f"extra argument {flag} takes a file under [llama] model_dirs, and none is configured")
    if (any(ord(c) < 32 or c in ',"\x7f' for c in path) or not os.path.isabs(path)
            or os.path.normpath(path) != path or not flags.under(path, dirs)):
        raise BadInput(f"extra argument {flag} takes one file under [llama] model_dirs ({where}), given by its"
                       f" absolute path; not {path[:120]!r}")
def check_files(cmdline: Sequence[str], model_dirs: Sequence[str]) -> None:
    """BadInput naming the first file flag whose file does not really lie under `model_dirs` (symlinks
    resolved): run by the member's own process before its launch, for a one-line refusal. The supervisor
    checks again on the descriptor it hands over (app.llama.supervisor), which is what holds."""
    dirs = [os.path.realpath(d) for d in model_dirs if os.path.isabs(d)]
    try:
        pairs = flags.split(list(cmdline[1:]), board=True)
    except flags.Refused as refused:
        raise BadInput(str(refused)) from None
    for flag, values in pairs:
        if flag in flags.FILES:
            real = os.path.realpath(values[0])
            if not os.path.isfile(real) or not flags.under(real, dirs):
                raise BadInput(f"extra argument {flag}: {values[0][:120]} is not a file under [llama] model_dirs"
                               " (symlinks resolved)")


def cache_type(which: str, name: str) -> str:
    if name not in CACHE_TYPES:
        raise BadInput(f"--cache-type-{which} {name[:20]!r} is not a cache type; use one of {', '.join(CACHE_TYPES)}")
    return name


def server_argv(
    binary: str, *, model: str, host: str, port: int, ctx: int, parallel: int, split_mode: str = "layer",
    tensor_split: str | None = None, metrics: bool = False, alias: str | None = None, extra: Sequence[str] = (),
    cache_types: tuple[str, str] = ("f16", "f16"), flash_attn: str = "on",
) -> list[str]:
    argv = [binary, "-m", model, "--host", host, "--port", str(port), "-c", str(ctx), "-np", str(parallel),
            "-ngl", "999", "--split-mode", split_mode, "-fa", flash_attn, "-ctk", cache_types[0], "-ctv", cache_types[1],
            "-lv", "4"]
    if tensor_split:
        argv += ["--tensor-split", tensor_split]
    if metrics:
        argv.append("--metrics")
    if alias:
        argv += ["--alias", alias]
    return argv + list(extra)


_ARG_VARIABLES = {"LLAMA_API_KEY", "HF_TOKEN", "MTMD_BACKEND_DEVICE"}  # arg.cpp's other options read from the environment


def server_env(card_uuids: Sequence[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The caller's environment, pinned to the booked cards. LLAMA_ARG_* variables (and the few other names
    arg.cpp reads options from) are dropped, so that the recorded command line is the whole truth about how
    the server was started."""
    env = {k: v for k, v in environ.items() if not k.startswith("LLAMA_ARG_") and k not in _ARG_VARIABLES}
    uuids = ",".join(card_uuids)
    env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuids, NVIDIA_VISIBLE_DEVICES=uuids)
    return env
