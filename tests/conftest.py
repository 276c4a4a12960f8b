import numpy as np
import pytest

import cso


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


@pytest.fixture
def restore_threads():
    """The thread count as it was before the test, whatever the test sets."""
    before = cso.get_num_threads()
    yield
    cso.set_num_threads(before)
