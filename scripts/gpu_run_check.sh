#!/usr/bin/env bash
# `board run` on a real GPU through the service: CUDA sees exactly the booked card (by UUID), and the
# service stops the job when its booking is released. Run as root from the repo root, after gpu_check.sh
# has made the user board.
set -u
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
T=$(mktemp -d /tmp/board-run-XXXX); chmod 755 "$T"
export PYTHONPATH=$PWD TZ=UTC
unset BOARD_SIMULATE BOARD_DB
getent group board >/dev/null || groupadd --system board
id board >/dev/null 2>&1 || useradd --system --gid board --no-create-home --shell /usr/sbin/nologin board
chmod -R o+rX "$PWD" 2>/dev/null
mkdir -p "$T/lib" "$T/run"; chown board:board "$T/lib" "$T/run"; chmod 700 "$T/lib"
printf '[storage]\ndb = "%s/lib/board.db"\n[service]\nsocket = "%s/run/board.sock"\ngroup = "board"\n[enforce]\ninterval_s = 0.5\ngrace_s = 3\n' "$T" "$T" >"$T/board.toml"
chmod 644 "$T/board.toml"
BOARD_CONFIG=$T/board.toml setsid setpriv --reuid board --regid board --init-groups --inh-caps +kill --ambient-caps +kill \
    -- "$PY" -m app agent >"$T/agent.log" 2>&1 &
AGENT=$!
for _ in $(seq 100); do [ -S "$T/run/board.sock" ] && break; sleep 0.1; done
export BOARD_CONFIG=$T/board.toml
ID=$("$PY" -m app book --cards 0 --for 1h --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['id'])")
echo "booking $ID"
"$PY" -m app run -- "$PY" -c "
import os, signal, sys, time, torch
signal.signal(signal.SIGTERM, lambda *_: (print('job: SIGTERM, checkpointing', flush=True), sys.exit(0)))
print('job: CUDA_VISIBLE_DEVICES', os.environ['CUDA_VISIBLE_DEVICES'], 'end', os.environ['BOARD_BOOKING_END'], flush=True)
print('job: torch sees', torch.cuda.device_count(), torch.cuda.get_device_name(0), flush=True)
x = torch.ones(1 << 28, device='cuda'); print('job: holding', x.numel() * 4 >> 20, 'MiB', flush=True)
time.sleep(60)
print('job: NOT stopped', flush=True)" >"$T/job.log" 2>&1 &
JOB=$!
for _ in $(seq 60); do grep -q holding "$T/job.log" && break; sleep 0.5; done
"$PY" -m app status
"$PY" -m app release "$ID"
START=$(date +%s%N)
wait "$JOB"; echo "job exit $? after $(( ($(date +%s%N) - START) / 1000000 )) ms"
cat "$T/job.log"
"$PY" -m app log | tail -4
kill "$AGENT"; wait "$AGENT"; echo "agent exit $?"
cp "$T/job.log" "$T/agent.log" "$OUT/" 2>/dev/null
