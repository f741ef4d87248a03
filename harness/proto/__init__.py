"""Sans-IO ggml-rpc codec: message table, dialects, frame readers, connections. No sockets."""

from .codec import (graph_payload_size, has_response, pack_request, pack_request_payload,
                    pack_response, pack_response_payload, response_payload_size,
                    unpack_request_payload, unpack_response_payload)
from .connection import ClientConnection, ServerConnection
from .constants import (BUFFER_USAGE_ANY, BUFFER_USAGE_COMPUTE, BUFFER_USAGE_WEIGHTS,
                        CONN_CAPS_SIZE, HASH_THRESHOLD, HELLO_ID, SERVER_FLAG_CACHE,
                        SET_TENSOR_HEADER_SIZE, Cmd)
from .dialects import (DEFAULT, DIALECTS, EMPTY_HELLO, NEWEST, PRIMARY, Dialect, client_accepts,
                       dialect_for_version, first_with, get_dialect)
from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .events import (NEED_DATA, ConnectionClosed, Data, EndOfMessage, Request, RequestHead,
                     Response, ResponseHead)
from .fnv import Fnv1a64, cache_file_name, fnv1a64
from .readers import RequestReader, ResponseReader
from .messages import *  # noqa: F401,F403 - the message classes are the public vocabulary
from .messages import REQUEST_TYPES, RESPONSE_TYPES, TABLE, Message, spec_for
from .session import Exchange, Session, SessionDecoder, decode_session
from .tensor import TENSOR_SIZE, RpcTensor, element_count, nbytes
from .wire import REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, request_header
