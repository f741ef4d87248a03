"""make_fill writes chunk by chunk; its bytes are the ones a single call gives (both sides of a
cell compute them: the client uploads them, the check compares what came back with them)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import harness.impls.driver as driver
from harness.impls.driver import DTYPES, make_fill


def one_call(fill: dict, nbytes: int) -> np.ndarray:
    """The definition: each pattern drawn in one call, as wide as numpy makes it."""
    dtype = np.dtype(DTYPES[fill.get("dtype", "f32")])
    count = nbytes // dtype.itemsize
    pattern = fill.get("pattern", "arange")
    if pattern == "arange":
        arr = ((np.arange(count, dtype=np.float64) % 1024 + fill.get("value", 0.0))
               if dtype.kind == "f" else np.arange(count) % 256).astype(dtype)
    elif pattern == "random":
        rng = np.random.default_rng(fill.get("seed", 0))
        arr = (rng.uniform(-1.0, 1.0, count) if dtype.kind == "f"
               else rng.integers(0, 256, count)).astype(dtype)
    else:
        arr = np.full(count, fill.get("value", 0), dtype=dtype)
    out = np.zeros(nbytes, dtype=np.uint8)
    out[:count * dtype.itemsize] = arr.view(np.uint8)
    return out


FILLS = st.fixed_dictionaries({"pattern": st.sampled_from(["arange", "random", "const"]),
                               "dtype": st.sampled_from(sorted(DTYPES)),
                               "seed": st.integers(0, 1 << 32), "value": st.integers(0, 100)})


@settings(max_examples=200, deadline=None)
@given(fill=FILLS, nbytes=st.integers(0, 4200))
def test_chunked_fill_is_the_one_call_fill(fill, nbytes):
    chunk = driver.FILL_CHUNK
    driver.FILL_CHUNK = 64  # many chunk edges in a small fill
    try:
        assert make_fill(fill, nbytes).tobytes() == one_call(fill, nbytes).tobytes()
    finally:
        driver.FILL_CHUNK = chunk


@pytest.mark.parametrize("pattern", ["arange", "random"])
def test_a_large_fill_past_the_periods_and_chunks(pattern):
    fill = {"pattern": pattern, "dtype": "u8", "seed": 103}
    n = 3 * driver.FILL_CHUNK + 4099
    assert make_fill(fill, n).tobytes() == one_call(fill, n).tobytes()


def test_the_equivalence_catches_a_period_not_repeated(monkeypatch):
    """Planted: a tiling that writes the period once and leaves the rest zero."""
    monkeypatch.setattr(driver, "_tile", lambda arr, period: arr.__setitem__(
        slice(0, len(period)), period))
    fill = {"pattern": "arange", "dtype": "u8"}
    assert make_fill(fill, 1000).tobytes() != one_call(fill, 1000).tobytes()


def test_a_data_check_remembers_its_expected_bytes_per_fill_function(monkeypatch):
    """data_check draws each (fill, size) once a process; a planted make_fill (the data-check
    tests' wrong byte) is still seen after the honest one was remembered."""
    import harness.scenario as api
    fill = {"pattern": "random", "seed": 7, "dtype": "u8"}
    got = driver.fingerprint(make_fill(fill, 4099))
    assert api.data_check("c", got, fill, 4099).ok
    assert api.data_check("c", got, fill, 4099).ok  # the remembered answer
    assert not api.data_check("c", got, fill, 4098).ok

    def wrong(f, n):
        out = make_fill(f, n)
        out[-1] ^= 0xFF
        return out
    monkeypatch.setattr(api, "make_fill", wrong)
    assert not api.data_check("c", got, fill, 4099).ok
