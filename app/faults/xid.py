"""What an Xid code means, in one line, after NVIDIA's "Xid Errors" table (docs.nvidia.com/deploy/xid-errors)."""

from __future__ import annotations

MEANINGS = {
    8: "GPU stopped processing (a channel timed out)",
    13: "graphics engine exception (often the application: an illegal address or instruction)",
    31: "GPU memory page fault (usually the application's illegal memory access)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (a user application fault)",
    45: "preemptive cleanup after earlier errors (a process was killed)",
    48: "double-bit ECC error (uncorrectable memory error)",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    154: "GPU recovery action changed (a reset or reboot may be needed)",
}


UNKNOWN = "see NVIDIA's Xid table"


def meaning(code: int | None) -> str:
    """What the Xid means; a code not in MEANINGS, or none (GpuEvent.code is optional), points to the table."""
    return MEANINGS.get(code, UNKNOWN) if code is not None else UNKNOWN
