"""llama-server lifecycle: launch on exactly a booking's cards, health, logs, stop, and the booking-end rule.

- command.py: the command line and CUDA environment (booked UUIDs in topology order)
- supervisor.py: the detached wrapper that owns each server and records how it ended (design notes there)
- service.py: the rules (who may start and stop, port leases, waiting for ready, reconcile, booking end)
- identity.py: pid + create time + command line, so a reused PID is never signalled
- rows.py: the servers table; health.py: /health and /metrics; logs.py: per-server log files
- processes.py: servers shown as GPU processes on the simulated fleet

Kept light: importing app.llama imports nothing else, so the quick CLI and the supervisor start fast.
"""
