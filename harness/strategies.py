"""Hypothesis strategies for ggml-rpc: valid messages, frames, graphs and structured mutations.

The public face of :mod:`harness.fuzz.strategies`; import from here in your own tests::

    from hypothesis import given
    from harness import strategies as rst

    @given(rst.request_frames("7.0.0"))
    def test_my_server_survives(frame): ...
"""

from .fuzz import strategies as _impl
from .fuzz.strategies import *  # noqa: F401,F403
from .fuzz.strategies import __all__  # noqa: F401

# The *_WHATS lists are read from the mutation registry when asked for (see __getattr__), so
# the star import's snapshot of them goes.
del FRAMING_WHATS, FLAG_WHATS, FIELD_WHATS  # noqa: F821


def __getattr__(name: str):
    return getattr(_impl, name)
