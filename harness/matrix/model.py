"""matrix.yaml: the schema (pydantic) and a loader that reports errors with line numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import scenarios  # noqa: F401 - importing the package registers every scenario

from .errors import MatrixError
from ..reference.knobs import parse_knobs
from ..proto.dialects import ALIASES, DIALECTS, get_dialect
from ..scenario import OUTCOMES, SCENARIOS

ROLES = ("old-client", "new-client", "old-server", "new-server")
CELLS = (("old-client", "old-server"), ("old-client", "new-server"),
         ("new-client", "old-server"), ("new-client", "new-server"))
OutcomeName = Literal[OUTCOMES]  # type: ignore[valid-type] - the outcomes a scenario can observe
# tcp: the real wire; rdma-emu: reference peers over the emulated RDMA transport; rdma-verbs:
# reference peers over pyverbs on a real device; rdma-soft: the real RDMA builds of the pins
# over softverbs, the project's software verbs device (docs/RDMA.md, section 4)
TRANSPORTS = ("tcp", "rdma-emu", "rdma-verbs", "rdma-soft")
TransportName = Literal["tcp", "rdma-emu", "rdma-verbs", "rdma-soft"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Implementation(_Strict):
    kind: Literal["ref", "pin", "user", "docker"]
    proto: str = Field(description="dialect name, e.g. 7.0.0, 7.0.0+flags, 9.0.0")
    roles: list[Literal["client", "server"]] = ["client", "server"]
    pin: Optional[str] = None  # kind pin/user: the registry name
    image: Optional[str] = None  # kind docker
    command: Optional[list[str]] = None  # kind docker
    port: Optional[int] = None  # kind docker: port inside the container
    server_args: list[str] = []  # kind ref: extra `harness serve` arguments (e.g. --knob ...)
    # kind ref: misbehaviour knobs NAME=VALUE of the reference client in this role (a client
    # that lies, to show a check failing)
    client_knobs: list[str] = []
    description: str = ""

    @field_validator("proto")
    @classmethod
    def _known_dialect(cls, v: str) -> str:
        try:
            return get_dialect(v).name
        except ValueError:
            raise ValueError(f"unknown dialect {v!r}; known: {', '.join(DIALECTS)}") from None

    @model_validator(mode="after")
    def _kind_fields(self):
        if self.kind in ("pin", "user") and not self.pin:
            raise ValueError(f"kind {self.kind} needs 'pin' (a name from `harness peers list`)")
        if self.kind == "docker" and not self.image:
            raise ValueError("kind docker needs 'image'")
        if self.client_knobs:
            if self.kind != "ref":
                raise ValueError("client_knobs: only the reference client (kind ref) has knobs")
            parse_knobs(self.client_knobs)  # ValueError names an unknown knob
        return self


class Design(_Strict):
    description: str = ""
    transports: Optional[list[TransportName]] = None  # None: the matrix's transports
    scenarios: Optional[list[str]] = None  # None: the matrix's scenarios
    # an rdma-emu design whose cells predict this design's RDMA cells (same dialect in every
    # role): tests/test_rdma_soft_matrix.py holds the two to the same verdicts and facts
    emulation: Optional[str] = None
    roles: dict[Literal["old-client", "new-client", "old-server", "new-server"], str]

    @field_validator("roles")
    @classmethod
    def _all_roles(cls, v: dict) -> dict:
        missing = [r for r in ROLES if r not in v]
        if missing:
            raise ValueError(f"missing roles: {', '.join(missing)}")
        return v


class Expectation(_Strict):
    """First matching rule wins; unset match fields match anything."""

    design: Optional[str | list[str]] = None
    cell: Optional[str] = None  # "old-client/new-server"
    transport: Optional[TransportName] = None
    cache: Optional[bool] = None
    scenario: Optional[str] = None
    outcome: OutcomeName
    degraded: list[str] = []  # works-degraded: what degrades
    side: Optional[Literal["client", "server"]] = None  # rejected-at-hello: who refuses
    message: Optional[str] = None  # substring of the rejecting side's message
    signature: Optional[str] = None  # failed: substring of the failure signature
    because: str = ""  # why this is expected (spec section, seed)

    @field_validator("cell")
    @classmethod
    def _cell(cls, v):
        if v is not None and tuple(v.split("/")) not in CELLS:
            raise ValueError(f"cell must be one of {', '.join('/'.join(c) for c in CELLS)}")
        return v


class Releases(_Strict):
    peers: list[str]
    scenario: str = "handshake"
    description: str = ""


class AllowedSkip(_Strict):
    """A skip every run of this matrix accepts: a known gap of the harness, with its reason
    (a skip code or a substring of the skip's reason, as --allow-skip takes)."""

    match: str
    because: str


class Defaults(_Strict):
    deadline: float = 120.0  # seconds for one cell x scenario
    idle_timeout: float = 30.0  # seconds without a byte on the wire while a client runs
    workers: int = 3


class Matrix(_Strict):
    version: Literal[1] = 1
    defaults: Defaults = Defaults()
    implementations: dict[str, Implementation]
    designs: dict[str, Design]
    scenarios: list[str]
    transports: list[TransportName] = ["tcp"]
    cache_options: dict[str, list[bool]] = {}  # scenario -> server cache values to run
    expectations: list[Expectation]
    releases: Optional[Releases] = None
    allowed_skips: list[AllowedSkip] = []

    @model_validator(mode="after")
    def _references(self):
        self._reference_peers_named_by_version()
        for dname, d in self.designs.items():
            for role, impl in d.roles.items():
                if impl not in self.implementations:
                    raise ValueError(f"designs.{dname}.roles.{role}: unknown implementation {impl!r} "
                                     "(nor the version of a row of harness/proto/dialects.py)")
                want = role.split("-")[1]
                if want not in self.implementations[impl].roles:
                    raise ValueError(f"designs.{dname}.roles.{role}: {impl} cannot play a {want}")
        for dname, d in self.designs.items():
            for s in d.scenarios or []:
                if s not in self.scenarios:
                    raise ValueError(f"designs.{dname}.scenarios: {s!r} is not in the matrix's "
                                     "scenarios")
            if d.emulation is not None:
                self._check_emulation(dname, d)
        for s in self.scenarios + list(self.cache_options):
            if s not in SCENARIOS:
                where = "scenarios" if s in self.scenarios else f"cache_options.{s}"
                raise ValueError(f"{where}: unknown scenario {s!r}; known: {', '.join(SCENARIOS)}")
        for i, e in enumerate(self.expectations):
            for d in ([e.design] if isinstance(e.design, str) else e.design or []):
                if d not in self.designs:
                    raise ValueError(f"expectations.{i}.design: unknown design {d!r}")
            if e.scenario is not None and e.scenario not in SCENARIOS:
                raise ValueError(f"expectations.{i}.scenario: unknown scenario {e.scenario!r}")
        return self

    def _reference_peers_named_by_version(self) -> None:
        """A role may name a dialect row by its version ("7.1.0") or short name instead of an
        implementation: the reference peer speaking that row, implementation ``ref-<row>``."""
        for dname, d in self.designs.items():
            for role, named in list(d.roles.items()):
                row = DIALECTS.get(ALIASES.get(named, named))
                if named in self.implementations or row is None:
                    continue
                key = f"ref-{row.name}"
                have = self.implementations.get(key)
                if have is None:
                    self.implementations[key] = Implementation(
                        kind="ref", proto=row.name,
                        description=f"reference peer speaking {row.name} (a role names its row)")
                elif (have.kind, have.proto) != ("ref", row.name):
                    raise ValueError(f"designs.{dname}.roles.{role}: {named!r} is the reference "
                                     f"peer {key}, but implementations.{key} is another")
                d.roles[role] = key

    def _check_emulation(self, dname: str, d: "Design") -> None:
        emu = self.designs.get(d.emulation)
        if emu is None:
            raise ValueError(f"designs.{dname}.emulation: unknown design {d.emulation!r}")
        if "rdma-emu" not in (emu.transports or self.transports):
            raise ValueError(f"designs.{dname}.emulation: {d.emulation} has no rdma-emu cells")
        for role in ROLES:
            mine = self.implementations[d.roles[role]].proto
            theirs = self.implementations[emu.roles[role]].proto
            if mine != theirs:
                raise ValueError(f"designs.{dname}.emulation: {role} speaks {mine} here, "
                                 f"{theirs} in {d.emulation}")


def _line_index(node, path=(), out=None) -> dict:
    """Map every key path of a YAML document to the line it starts on (1-based)."""
    out = {} if out is None else out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            out[path + (key,)] = k.start_mark.line + 1
            _line_index(v, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _line_index(v, path + (i,), out)
    return out


def load_matrix(path: str | Path) -> Matrix:
    path = Path(path)
    text = path.read_text()
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MatrixError(f"{path}: not valid YAML: {e}") from None
    lines = _line_index(node) if node is not None else {}
    try:
        return Matrix.model_validate(data or {})
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = tuple(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            head, sep, rest = msg.partition(": ")
            if not loc and sep and " " not in head:
                # cross-reference errors name their own path ("designs.bump.roles.old-client")
                loc = tuple(int(p) if p.isdigit() else p for p in head.split("."))
                msg = rest
            line = None
            for n in range(len(loc), -1, -1):  # the deepest located ancestor
                line = lines.get(loc[:n])
                if line is not None:
                    break
            where = ".".join(str(p) for p in loc) or "(top level)"
            msgs.append(f"{path}:{line or '?'}: {where}: {msg}")
        raise MatrixError("\n".join(msgs)) from None
