"""Hypothesis strategies for ggml-rpc messages, frames, graphs and structured mutations, and the
mutation registry. Import from here in your own tests::

    from hypothesis import given
    from harness import strategies as rst

    @given(rst.request_frames("7.0.0"))
    def test_my_server_survives(frame): ...

Two families:

* **Valid data** -- :func:`rpc_tensors`, :func:`messages`, :func:`exchanges`,
  :func:`request_frames`, :func:`response_frames`, :func:`graphs`, :func:`sessions`
  (:mod:`.basics`, :mod:`.graphs`, :mod:`.messages`: one request drawer per command in
  :data:`REQUEST_DRAWERS`). Everything they produce packs and decodes under the dialect it
  was drawn for, and only uses fields that exist on that dialect's wire (``cache_flag`` only
  where ``dialect.cache_flag``, ``uid`` only where ``dialect.graph_uid``, HELLO caps/flags only
  where ``dialect.hello_caps`` / ``dialect.server_flags``).
* **Structured mutations** -- :func:`framing_mutations`, :func:`flag_mutations`,
  :func:`field_mutations` and their union :func:`mutations`. Each draws a :class:`Mutation`, a
  ``(description, data)`` pair: ``data`` is the bytes to put on the wire and ``description`` a
  small JSON-serialisable dict (see :data:`DESCRIPTION_KEYS`) such as
  ``{"kind": "framing", "what": "len_too_large", "cmd": "GET_ALIGNMENT", "field": "len", ...}``
  so a fuzz report can count coverage of command x field. Every operator is one function
  registered with :func:`mutation` (or :func:`tensor_mutation`) in :mod:`.framing`,
  :mod:`.flags` or :mod:`.fields`; :func:`mutation_catalogue` lists every ``(kind, what, cmd)``
  the registry can produce for a dialect, and ``FRAMING_WHATS`` / ``FLAG_WHATS`` /
  ``FIELD_WHATS`` are read from it.

Dialect arguments accept a :class:`~harness.proto.Dialect` or any name/alias
:func:`~harness.proto.get_dialect` knows ("7.0.0", "7f", "9", ...).
"""

from __future__ import annotations

from ..proto.constants import Cmd
from ..proto.dialects import Dialect
from .basics import (INVALID_TYPE_IDS, REMOVED_TYPE_IDS, VALID_TYPE_IDS, BufferRegion, Buffers,
                     buffer_regions, conn_caps, dialects, rpc_tensors, tensor_names, type_ids)
from .graphs import GRAPH_SHAPES, graphs
from .messages import (REQUEST_DRAWERS, RESPONSE_DRAWERS, exchanges, hello_request_frame,
                       messages, request_frames, response_frames, sessions)
from .registry import (DESCRIPTION_KEYS, MUTATION_KINDS, MUTATIONS, Mutation, MutationOp, MutationSite,
                       candidates, check_description, mutation, mutation_catalogue, mutations,
                       strategy_of, tensor_mutation, unregister, whats)
from . import boundaries as _boundaries, fields as _fields, flags as _flags, framing as _framing  # noqa: F401 - register

__all__ = [
    # building blocks
    "BufferRegion", "Buffers", "buffer_regions", "dialects", "type_ids", "VALID_TYPE_IDS",
    "REMOVED_TYPE_IDS", "INVALID_TYPE_IDS", "tensor_names", "conn_caps", "rpc_tensors",
    # valid messages
    "messages", "exchanges", "request_frames", "response_frames", "sessions", "graphs",
    "GRAPH_SHAPES", "hello_request_frame", "REQUEST_DRAWERS", "RESPONSE_DRAWERS",
    # mutations
    "Mutation", "framing_mutations", "flag_mutations", "field_mutations", "mutations",
    "mutation_catalogue", "check_description", "DESCRIPTION_KEYS", "MUTATION_KINDS",
    "FRAMING_WHATS", "FLAG_WHATS", "FIELD_WHATS",
    # the registry
    "MUTATIONS", "MutationOp", "MutationSite", "candidates", "mutation", "tensor_mutation", "unregister",
    "whats",
]

_WHATS_OF = {"FRAMING_WHATS": "framing", "FLAG_WHATS": "flag", "FIELD_WHATS": "field"}


def __getattr__(name: str):
    # Read from the registry at access time, so an operator registered later is listed too.
    if name in _WHATS_OF:
        return whats(_WHATS_OF[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def framing_mutations(dialect: Dialect | str, cmd: Cmd | str | None = None, *,
                      what: str | None = None, buffers: Buffers = None):
    """Framing mutations of valid request frames (``kind == "framing"``, see
    :mod:`.framing`), of one command or of all."""
    return strategy_of(dialect, "framing", cmd, what=what, buffers=buffers)


def flag_mutations(dialect: Dialect | str, *, what: str | None = None,
                   buffers: Buffers = None):
    """Flag-byte mutations (``kind == "flag"``, see :mod:`.flags`); ValueError for a dialect
    without flag bytes (3.6.1)."""
    return strategy_of(dialect, "flag", what=what, buffers=buffers)


def field_mutations(dialect: Dialect | str, cmd: Cmd | str | None = None, *,
                    what: str | None = None, buffers: Buffers = None):
    """Field mutations of otherwise valid requests (``kind == "field"``, see :mod:`.fields`).
    With ``buffers`` (live :class:`BufferRegion` s of the target connection) the bounds are
    relative to real buffers and ``at == "after_setup"``."""
    return strategy_of(dialect, "field", cmd, what=what, buffers=buffers)
