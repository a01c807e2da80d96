"""Label columns read as text once per distinct value: the same answers as reading every
row's text, for categoricals with unused and missing values and for plain columns."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from burnrate.analyzer.grid.series import distinct_text, labelled, text
from burnrate.analyzer.sources.common import is_simulated

VALUES = ["b", "", None, "a", "b", "x"]


def columns() -> list[pd.Series]:
    plain = pd.Series(VALUES, dtype=object)
    categorical = pd.Series(pd.Categorical(VALUES, categories=["a", "b", "", "x", "unused"]))
    return [plain, categorical, pd.Series(pd.Categorical([1, 2, 2]))]


def missing_as_none(values) -> list:
    """NaN, which equals nothing, as None, to compare."""
    return [None if isinstance(v, float) and np.isnan(v) else v for v in values]


@pytest.mark.parametrize("column", columns(), ids=["plain", "categorical", "numbers"])
def test_text_reads_as_astype_str(column):
    rowwise = column.astype(str).to_numpy(object)
    assert missing_as_none(text(column)) == missing_as_none(rowwise)
    assert set(missing_as_none(distinct_text(column))) == set(missing_as_none(rowwise))
    for values in ({""}, {"b", "nan"}, {"1"}, set()):
        np.testing.assert_array_equal(labelled(column, values), np.isin(rowwise, list(values)))


def test_unused_categories_are_not_distinct_values():
    column = pd.Series(pd.Categorical(["a"], categories=["a", "gone"]))
    assert distinct_text(column) == {"a"}
    assert distinct_text(column.iloc[:0]) == set()


def test_a_simulated_fleet_is_told_by_its_model_names_even_with_some_missing():
    models = pd.Categorical(["NVIDIA H100 80GB HBM3 (simulated)", None], categories=["NVIDIA H100 80GB HBM3 (simulated)", "A"])
    assert is_simulated(pd.DataFrame({"modelName": models}))
    assert not is_simulated(pd.DataFrame({"modelName": pd.Categorical(["A", None])}))
    assert not is_simulated(pd.DataFrame({"modelName": pd.Categorical([])}))
