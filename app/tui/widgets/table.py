"""A DataTable whose auto-width columns show at the width they are measured to, whenever the screen drew first."""

from __future__ import annotations

from typing import Iterable

from textual.widgets import DataTable
from textual.widgets.data_table import RowKey


class MeasuredTable(DataTable):
    """Textual's DataTable sizes its auto-width columns to new rows in its idle pass, but its drawn lines are cached
    under a key that pass does not change: a screen drawn between the rows' arrival and that pass (a loaded machine,
    the screen's update timer first) kept the columns as narrow as their labels, cells cut (`ok {"ca`), until the
    cursor moved. A new key after each measure makes the next draw use the measured widths."""

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        super()._update_dimensions(new_rows)
        self._update_count += 1  # the caches' key (Textual bumps it the same way on a resize)
