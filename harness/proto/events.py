"""Events the incremental readers return (h11 style)."""

from __future__ import annotations

from dataclasses import dataclass

from .messages import Message


class _Sentinel:
    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA = _Sentinel("NEED_DATA")


@dataclass(frozen=True, slots=True)
class Request:
    """A whole request, decoded."""

    message: Message
    frame_size: int  # header + payload bytes this request took on the wire


@dataclass(frozen=True, slots=True)
class RequestHead:
    """The fixed header of a streamed request; ``data_length`` payload bytes follow as Data."""

    message: Message  # its ``data`` field is empty
    data_length: int


@dataclass(frozen=True, slots=True)
class Response:
    message: Message
    frame_size: int


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A streamed response (GET_TENSOR): ``data_length`` bytes follow as Data."""

    request: Message
    data_length: int


@dataclass(frozen=True, slots=True)
class Data:
    data: bytes


@dataclass(frozen=True, slots=True)
class EndOfMessage:
    pass


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed the stream cleanly at a frame boundary."""
