"""Protocol errors, split the h11 way: who broke the protocol decides the class."""

from __future__ import annotations

from ..errors import HarnessError


class ProtocolError(HarnessError):
    """Base class of every error the codec raises."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something this dialect does not allow.

    ``command`` is the command id (or name) the bytes belonged to, ``field`` the
    field that was wrong and ``offset`` its byte offset inside the frame, so a
    report can point at the exact byte.
    """

    def __init__(self, reason: str, *, command: int | str | None = None,
                 field: str | None = None, offset: int | None = None):
        self.reason = reason
        self.command = command
        self.field = field
        self.offset = offset
        where = []
        if command is not None:
            where.append(f"command={command}")
        if field is not None:
            where.append(f"field={field}")
        if offset is not None:
            where.append(f"offset={offset}")
        super().__init__(f"{reason} ({', '.join(where)})" if where else reason)


class LocalProtocolError(ProtocolError):
    """We were asked to send something the dialect does not allow."""
