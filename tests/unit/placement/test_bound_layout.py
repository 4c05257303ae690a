"""The bound's per-topology layout: distinct (a, b) pairs over one int64 key, as numpy's row sort
gives them."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from apps.placement.bounds.capacity import _distinct_pairs, _pairs, _regions

pairs = st.integers(1, 300).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 50), min_size=n, max_size=n),
        st.lists(st.integers(0, 9), min_size=n, max_size=n),
    )
)


@given(pairs)
def test_distinct_pairs_match_numpys_unique_over_columns(ab):
    a, b = (np.array(x, dtype=np.int64) for x in ab)
    want, want_inverse = np.unique(np.stack([a, b]), axis=1, return_inverse=True)
    got, inverse = _distinct_pairs(a, b)
    assert np.array_equal(got, want)
    assert np.array_equal(inverse, want_inverse.ravel())
    assert np.array_equal(got[:, inverse], np.stack([a, b]))


def test_pairs_index_each_pair_and_name_its_first_member():
    index, first = _pairs(np.array([3, 1, 3, 1]), np.array([7, 2, 7, 5]))
    assert index.tolist() == [2, 0, 2, 1]
    assert first.tolist() == [1, 1, 3]


def test_regions_join_domains_that_share_a_leaf():
    # Domains 0 and 1 share leaf 0, domain 2 is alone under leaf 1, domain 3 straddles leaves 1 and 2.
    region = _regions(4, np.array([0, 1, 2, 3, 3]), np.array([0, 0, 1, 1, 2]))
    assert region[0] == region[1] != region[2] == region[3]
