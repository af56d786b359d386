"""The hosts of one board: this host's heartbeat, the others' cards as last read, and the status document."""
