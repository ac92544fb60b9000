import pytest

import tinygrad_attn as ta

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not ta.cuda.is_available(), reason="needs CuPy and a CUDA GPU"))]


@pytest.fixture(params=DEVICES)
def device(request):
    """Run a test on every device this machine has ("cuda" skips cleanly without a GPU)."""
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    ta.manual_seed(0)
