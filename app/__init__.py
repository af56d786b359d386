"""board: a terminal GPU occupancy board and booking calendar for a shared server."""

__version__ = "0.1.0"
