"""A connection's parts: who is at the other end (the kernel's word), its lines read against a deadline."""
