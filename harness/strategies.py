"""Hypothesis strategies for ggml-rpc: valid messages, frames, graphs and structured mutations.

The public face of :mod:`harness.fuzz.strategies`; import from here in your own tests::

    from hypothesis import given
    from harness import strategies as rst

    @given(rst.request_frames("7.0.0"))
    def test_my_server_survives(frame): ...
"""

from .fuzz.strategies import *  # noqa: F401,F403
from .fuzz.strategies import __all__  # noqa: F401
