#!/usr/bin/env bash
# board's NVML path end to end, on a machine with an NVIDIA driver (run as root from the repo root).
# What no test here can do without a GPU: read real cards, see a real CUDA process on them, and serve
# that to a member through the service. Writes what it saw to $OUT (default: a temporary directory).
#   scripts/gpu_check.sh            # needs python3 with nvidia-ml-py and psutil; torch for the CUDA process
set -u
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
T=$(mktemp -d /tmp/board-gpu-XXXX)
chmod 755 "$T"
export PYTHONPATH=$PWD TZ=UTC
unset BOARD_SIMULATE BOARD_CONFIG
board() { timeout 60 "$PY" -m app "$@"; }
step() { printf '\n== %s\n' "$*"; }

step driver
nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,temperature.gpu,power.draw,power.limit --format=csv

step "file mode, idle (the NVML backend, no simulation)"
export BOARD_DB=$T/own.db
board status --json >"$OUT/status_idle.json"; echo "rc=$?"
board status

step "the box, read-only (issue 23): never changes the machine's settings; power apply only as --dry-run"
nvidia-smi --query-gpu=index,serial,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,power.limit,power.default_limit,power.max_limit,persistence_mode,compute_cap --format=csv
nvidia-smi topo -m
board cards --json >"$OUT/cards.json"; echo "rc=$?"
board cards
board cards --labels
board topo
board power --json >"$OUT/power.json"; echo "rc=$?"
printf '[power]\nlimit_w = 400\npause_s = 0\n' >"$T/power.toml"
BOARD_CONFIG=$T/power.toml board power apply --dry-run
board doctor | grep -E "CUDA|PCIe|llama|card " | tee "$OUT/doctor_box.txt"

step "a CUDA process holding 8 GiB: who is on the card"
"$PY" -c "import torch, time; x = torch.empty(8 << 30, dtype=torch.uint8, device='cuda'); print('holding', flush=True); time.sleep(120)" >"$T/cuda.log" 2>&1 &
CUDA=$!
for _ in $(seq 60); do grep -q holding "$T/cuda.log" && break; sleep 0.5; done
cat "$T/cuda.log"
board status --json >"$OUT/status_busy.json"; echo "rc=$?"
board status
step "booked by its user: IN USE"
board book --cards 0 --for 1h --note "gpu check"
board status --json >"$OUT/status_booked.json"
board status

step "the service: user board, CAP_KILL only, real NVML, a member asks over the socket"
unset BOARD_DB
getent group board >/dev/null || groupadd --system board
id board >/dev/null 2>&1 || useradd --system --gid board --no-create-home --shell /usr/sbin/nologin board
chmod -R o+rX "$PWD" 2>/dev/null
mkdir -p "$T/lib" "$T/run"; chown board:board "$T/lib" "$T/run"; chmod 700 "$T/lib"; chmod 755 "$T/run"
printf '[storage]\ndb = "%s/lib/board.db"\n\n[service]\nsocket = "%s/run/board.sock"\ngroup = "board"\n' "$T" "$T" >"$T/board.toml"
chmod 644 "$T/board.toml"
BOARD_CONFIG=$T/board.toml setpriv --reuid board --regid board --init-groups --inh-caps +kill --ambient-caps +kill \
    -- "$PY" -m app agent >"$T/agent.log" 2>&1 &
AGENT=$!
for _ in $(seq 100); do [ -S "$T/run/board.sock" ] && break; sleep 0.1; done
cat "$T/agent.log"
export BOARD_CONFIG=$T/board.toml
board whoami
board status --json >"$OUT/status_socket.json"; echo "rc=$?"
board status
step "one NVML reader: reads per second with 0, then 5 subscribers"
timeout 60 "$PY" - "$T/run/board.sock" <<'PYEOF' | tee "$OUT/reads.txt"
import sys, threading, time
from app.client.socket import SocketClient
path = sys.argv[1]
stats = lambda: SocketClient(path).call("stats")
def rate(seconds=5.0):
    first = stats()["fleet_reads"]; time.sleep(seconds); return (stats()["fleet_reads"] - first) / seconds
print("subscribers 0: reads/s", rate())
clients = [SocketClient(path) for _ in range(5)]
for c in clients:
    threading.Thread(target=lambda c=c: [None for _ in c.subscribe(("fleet",))], daemon=True).start()
time.sleep(1.5)
print("subscribers", stats()["subscribers"], ": reads/s", rate())
for c in clients:
    c.close()
PYEOF
kill "$AGENT" "$CUDA" 2>/dev/null
wait "$AGENT" 2>/dev/null; echo "agent exit $?"
cp "$T/agent.log" "$OUT/agent.log"
step "what came back"
"$PY" - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("status_idle", "status_busy", "status_booked", "status_socket"):
    try:
        doc = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError) as error:
        print(name, "MISSING", error); continue
    card = doc["cards"][0]
    print(name, "simulated", doc["simulated"], "|", card["name"], card["memory_used_mib"], "/", card["memory_total_mib"],
          "MiB", card["temperature_c"], "C", card["power_w"], "W", "|", card["state"], card["warnings"], "|",
          [(p["user"], p["used_mib"]) for p in card["processes"]])
PYEOF
