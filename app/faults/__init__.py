"""Faults the seeds count (issue 12 section 3): Xid events, out-of-memory exits and thermal throttling.

store.py reads and writes the `faults` table; xid.py names the Xid codes; oom.py reads llama.cpp's logs;
throttle.py turns clock throttle reasons into spells with a duration; watcher.py is the service's thread.
"""
