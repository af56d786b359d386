"""board fit's estimate against the real CPU llama-server, over every test shape and a matrix of settings.

    .venv/bin/python scripts/fit_accuracy.py [LLAMA_SERVER]      (default: scripts/build_llama_server.sh's build)

Prints one line per run and the worst relative error of weights, KV and the total (weights + KV + compute).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.errors import BadInput  # noqa: E402
from app.fit.estimate import Settings, cpu_totals  # noqa: E402
from app.fit.gguf_model import read_model  # noqa: E402
from tests.fit.runner import ServerRefused, measure  # noqa: E402
from tests.fit.shapes import SHAPES, write_model  # noqa: E402

MATRIX = [
    Settings(ctx=4096, parallel=1), Settings(ctx=4096, parallel=4), Settings(ctx=8192, parallel=3, unified=True),
    Settings(ctx=2048, parallel=2, flash_attn=False), Settings(ctx=1000, parallel=1, flash_attn=False),
    Settings(ctx=8192, parallel=2, cache_type_k="q8_0", cache_type_v="q8_0"),
    Settings(ctx=4096, parallel=1, cache_type_k="q4_0", flash_attn=False),
    Settings(ctx=4096, parallel=2, cache_type_k="q4_0", cache_type_v="q4_0"),
]


def main() -> int:
    server = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
        [str(REPO / "scripts" / "build_llama_server.sh")], capture_output=True, text=True, check=True).stdout.split()[-1]
    worst = {"weights": (0.0, ""), "kv": (0.0, ""), "total": (0.0, "")}
    with tempfile.TemporaryDirectory() as directory:
        for name in SHAPES:
            path = write_model(Path(directory) / f"{name}.gguf", name)
            model = read_model(path)
            for s in MATRIX:
                label = (f"{name:<10} ctx {s.ctx:>5} np {s.parallel} {'kvu ' if s.unified else ''}"
                         f"{s.cache_type_k}/{s.cache_type_v} fa {'on' if s.flash_attn else 'off'}")
                try:
                    estimate = cpu_totals(model, s)
                except BadInput as error:
                    estimate = str(error)
                try:
                    got = measure(server, path, ctx=s.ctx, parallel=s.parallel, unified=s.unified,
                                  cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
                                  flash_attn="on" if s.flash_attn else "off", extra=["--no-repack"])
                except ServerRefused as error:
                    agree = "board refuses too" if isinstance(estimate, str) else "BOARD ACCEPTS IT"
                    print(f"{label}  llama.cpp refuses ({str(error)[:60]}); {agree}")
                    continue
                if isinstance(estimate, str):
                    print(f"{label}  BOARD REFUSES what llama.cpp runs: {estimate}")
                    continue
                devices = got.devices.values()
                real = {"weights": sum(d.weights_mib for d in devices), "kv": sum(d.kv_mib for d in devices)}
                real["total"] = real["weights"] + real["kv"] + sum(d.compute_mib for d in devices)
                ours = {"weights": estimate["weights_mib"], "kv": estimate["kv_mib"]}
                ours["total"] = ours["weights"] + ours["kv"] + estimate["compute_mib"]
                errors = {k: (ours[k] - real[k]) / real[k] if real[k] else 0.0 for k in real}
                for k, e in errors.items():
                    if abs(e) > abs(worst[k][0]):
                        worst[k] = (e, label)
                print(f"{label}  weights {real['weights']:8.2f}/{ours['weights']:8.2f}  kv {real['kv']:7.2f}/{ours['kv']:7.2f}"
                      f"  total {real['total']:8.2f}/{ours['total']:8.2f} MiB ({errors['total']:+.2%})")
    print()
    for k, (e, label) in worst.items():
        print(f"worst {k:<8} {e:+.2%}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
