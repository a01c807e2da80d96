"""Numbering the series of a tidy frame, shared by the views and the holding step."""
from __future__ import annotations

from typing import Collection

import numpy as np
import pandas as pd


def category_codes(column: pd.Series) -> tuple[np.ndarray, int]:
    codes, size = _narrow_codes(column)
    return codes.astype(np.int64), size


def text(column: pd.Series) -> np.ndarray:
    """A label column as text (an object array; a missing value stays NaN, as astype(str)
    leaves it): each distinct value of a categorical converted once, not each row."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype(str).to_numpy(object)
    return _names(column)[column.cat.codes.to_numpy()]


def labelled(column: pd.Series, values: Collection[str]) -> np.ndarray:
    """Rows whose label's text is one of `values`, compared once per distinct value."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype(str).isin(list(values)).to_numpy()
    return np.isin(_names(column), list(values))[column.cat.codes.to_numpy()]


def distinct_text(column: pd.Series) -> set[str]:
    """The distinct texts of a label column's rows."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return set(column.astype(str).unique())
    codes = column.cat.codes.to_numpy().astype(np.int64)
    used = np.bincount(codes + 1, minlength=len(column.cat.categories) + 1) > 0      # -1 first: NaN is last
    return set(_names(column)[np.roll(used, -1)])


def _names(column: pd.Series) -> np.ndarray:
    """A categorical's categories as text, with NaN last, where code -1 points."""
    return np.append(column.cat.categories.astype(str).to_numpy(object), np.nan).astype(object)


def series_numbers(frame: pd.DataFrame, by: tuple[str, ...]) -> np.ndarray:
    """Series number per row, 0..S-1, in order of the keys' categories."""
    if len(frame) == 0:
        return np.zeros(0, np.int64)
    if len(by) == 1:
        # One categorical key: its codes already number the series; drop unused categories.
        # Indexed by the narrow codes themselves (a missing label's -1 reads the table's last
        # entry): no int64 copy of every row's code, which a week of 11 M rows makes 88 MB.
        codes, size = _narrow_codes(frame[by[0]])
        used = np.zeros(size + 1, bool)
        used[codes] = True
        number = np.cumsum(np.roll(used, 1)) - 1          # a missing label first, as it sorts
        return np.roll(number, -1)[codes]
    combined = np.zeros(len(frame), np.int64)
    for col in by:
        codes, size = _narrow_codes(frame[col])
        combined *= size + 1         # in place: one row-long array, not three per key
        combined += codes
        combined += 1
    return pd.factorize(combined)[0].astype(np.int64, copy=False)


def _narrow_codes(column: pd.Series) -> tuple[np.ndarray, int]:
    """A label column's categorical codes as stored (int8 or int16 for a fleet's labels), -1 where missing."""
    cat = column if column.dtype == "category" else column.astype("category")
    return cat.cat.codes.to_numpy(), len(cat.cat.categories)


def series_codes(frame: pd.DataFrame, by: tuple[str, ...], labels: tuple[str, ...] = ()
                 ) -> tuple[np.ndarray, pd.DataFrame]:
    """Series number per row (0..S-1) and the labels of each series (from its first row)."""
    names = by + labels
    if len(frame) == 0:
        return np.zeros(0, np.int64), pd.DataFrame({c: pd.Series(dtype=object) for c in names})
    codes = series_numbers(frame, by)
    first = np.empty(codes.max() + 1, np.int64)
    # Reversed assignment leaves each series' first row: numpy keeps the last write.
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    keys = pd.DataFrame({c: frame[c].take(first).astype(str).to_numpy() for c in names})
    return codes, keys


def last_of(codes: np.ndarray, n: int) -> np.ndarray:
    """Each of codes 0..n-1's last position in `codes` (rows in time order: its last row), -1 where
    it has none."""
    last = np.full(n, -1, np.int64)
    last[codes] = np.arange(len(codes))     # numpy keeps the last write
    return last


def ramps(length: np.ndarray) -> np.ndarray:
    """0..len-1 for each length, concatenated."""
    total = int(length.sum())
    offsets = np.repeat(np.cumsum(length) - length, length)
    return np.arange(total) - offsets
