"""The cards' history, kept by the service: `store` (the SQLite file, its tables and queries) and `sampler`
(the loop that samples every card, rolls up and prunes). Imported only by the service and the benchmarks:
sqlite-utils (and numpy, where installed) stays off the quick CLI path."""
