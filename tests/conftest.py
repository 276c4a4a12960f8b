import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for ``reference``


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)
