"""The mutation registry: every structured mutation is one decorated function.

    @mutation("field", "device_invalid", fields=("device",),
              applies=lambda d, cmd: "device" in request_fields(d, cmd))
    def _(draw, site):
        v = draw(st.sampled_from((1, 7, 255)))
        return site.mutation("device", replace(site.request, device=v), value=v)

Everything else is derived from :data:`MUTATIONS`: the candidates each strategy samples from
(:func:`candidates`), the catalogue a fuzz report measures coverage against
(:func:`mutation_catalogue`, with the fields each operator can touch per command), the
description check (:func:`check_description`), the public ``*_WHATS`` lists, and what the
tests and the generator expect of a framing mutation (``refused_at``, ``may_wait``).
``@tensor_mutation`` registers a field mutation of one ``rpc_tensor`` for every command that
carries tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, NamedTuple

from hypothesis import strategies as st

from ..proto.codec import pack_request
from ..proto.constants import Cmd
from ..proto.dialects import DIALECTS, Dialect, get_dialect
from ..proto.messages import TENSOR, TENSORS10, GraphLayout, Message, spec_for
from ..proto.tensor import RpcTensor
from .basics import Buffers, BufferRegion, _draw_tensor, _regions
from .messages import _commands, _draw_request


class Mutation(NamedTuple):
    """A structured mutation: ``description`` (JSON-ready dict) and the wire ``data``."""

    description: dict
    data: bytes


MUTATION_KINDS = ("framing", "flag", "field")

#: Keys every description has (name -> type). Optional extras: ``value`` (int or str: the
#: value written), ``case`` (str: which edge, e.g. ``"end-nbytes+1"``), ``index`` (int:
#: array element or byte index), ``eof`` (bool: close the sending side after ``data``).
DESCRIPTION_KEYS = {"kind": str, "what": str, "cmd": str, "cmd_id": int, "field": str,
                    "dialect": str, "direction": str, "at": str}
_OPTIONAL_KEYS = {"value": (int, str), "case": str, "index": int, "eof": bool}
_ATS = ("connect", "after_hello", "after_setup")

Fields = tuple[str, ...] | Callable[[Dialect, Cmd], tuple[str, ...]]


@dataclass(frozen=True)
class MutationOp:
    """One registered mutation operator."""

    kind: str  # framing | flag | field
    what: str
    build: Callable  # (draw, MutationSite) -> Mutation
    applies: Callable[[Dialect, Cmd], bool]
    fields: Fields  # the description fields it can write, per (dialect, command)
    direction: str = "request"  # "response": a lie told to a client target
    unknown_cmd: bool = False  # applies to command bytes the dialect lacks, not to a Cmd
    # A first frame of a connection the server may accept (the session goes on after it).
    opening: bool = False
    # Framing mutations: the fields a receiving reader's refusal of the frame may name ("len",
    # "payload" when the bytes end inside it, "cmd"; a graph's "n_nodes" / "n_tensors" are
    # checked with its length), and whether the reader may wait for more bytes instead (a
    # length within its bound, garbage that may be the start of a frame).
    refused_at: tuple[str, ...] = ()
    may_wait: bool = False

    def fields_for(self, d: Dialect, cmd: Cmd | None) -> tuple[str, ...]:
        return self.fields(d, cmd) if callable(self.fields) else tuple(self.fields)

    @property
    def never_runs(self) -> bool:
        """Whatever its command, a receiver never runs it: refused at the frame's length, or
        the bytes end inside the frame."""
        return (self.kind == "framing" and not self.may_wait
                and set(self.refused_at) <= {"len", "payload", "n_nodes", "n_tensors"})


#: (kind, what) -> operator, in registration order.
MUTATIONS: dict[tuple[str, str], MutationOp] = {}


def _always(d: Dialect, cmd: Cmd) -> bool:
    return True


def mutation(kind: str, what: str, *, fields: Fields,
             applies: Callable[[Dialect, Cmd], bool] = _always, direction: str = "request",
             unknown_cmd: bool = False, opening: bool = False,
             refused_at: tuple[str, ...] = (), may_wait: bool = False):
    """Register the decorated ``fn(draw, site) -> Mutation`` as mutation ``kind``/``what``.

    ``applies(dialect, cmd)`` says for which commands of which dialects it exists (ignored
    with ``unknown_cmd=True``: the operator then picks a command byte the dialect lacks).
    ``fields`` names the description fields it writes (a tuple, or a function of dialect and
    command), for the report's command x field table. A framing mutation says how a reader
    refuses it (``refused_at``: the fields its refusal may name) and whether the reader may
    wait for more bytes instead (``may_wait``); no other kind breaks framing.
    """
    if kind not in MUTATION_KINDS:
        raise ValueError(f"unknown mutation kind {kind!r}; known: {', '.join(MUTATION_KINDS)}")
    if (kind, what) in MUTATIONS:
        raise ValueError(f"mutation {kind}/{what} is registered twice")
    if (kind == "framing") != bool(refused_at) or may_wait and kind != "framing":
        raise ValueError(f"mutation {kind}/{what}: a framing mutation, and only one, says "
                         "where a reader refuses it (refused_at=...)")

    def deco(fn):
        MUTATIONS[(kind, what)] = MutationOp(kind, what, fn, applies, fields, direction,
                                             unknown_cmd, opening, tuple(refused_at), may_wait)
        return fn
    return deco


def unregister(kind: str, what: str) -> None:
    """Remove a registered mutation (tests that register throw-away ones clean up)."""
    del MUTATIONS[(kind, what)]


def whats(kind: str) -> tuple[str, ...]:
    """The registered operators of ``kind``, in registration order."""
    return tuple(w for k, w in MUTATIONS if k == kind)


# ---------------------------------------------------------------- where a mutation applies

def tensor_slots(d: Dialect, cmd: Cmd) -> list[str]:
    """Names of the message fields that hold rpc_tensors (``srcs[]``/``tensors[]`` for arrays)."""
    layout = spec_for(d, cmd).request
    if isinstance(layout, GraphLayout):
        return ["tensors[]"]
    out = []
    for name, wt in layout.fields:
        if wt is TENSOR:
            out.append(name)
        elif wt is TENSORS10:
            out.append(name + "[]")
    return out


def request_fields(d: Dialect, cmd: Cmd) -> set[str]:
    """The request's field names on ``d``'s wire."""
    layout = spec_for(d, cmd).request
    if isinstance(layout, GraphLayout):
        return set(layout.offsets) | {"tensors"}
    return {name for name, _ in layout.fields} | ({layout.tail} if layout.tail else set())


class MutationSite:
    """Where one mutation is drawn: dialect, command, the buffers it may aim at, and (drawn
    on first use) the region and the valid request the mutation starts from."""

    def __init__(self, draw, op: MutationOp, d: Dialect, cmd: Cmd | None, buffers: Buffers):
        self.draw, self.op, self.d, self.cmd, self.buffers = draw, op, d, cmd, buffers
        self._region: BufferRegion | None = None
        self._request: Message | None = None

    @property
    def region(self) -> BufferRegion:
        if self._region is None:
            self._region = self.draw(_regions(self.buffers))
        return self._region

    @property
    def request(self) -> Message:
        """A valid request of this command, its tensors inside :attr:`region`."""
        if self._request is None:
            region = self.region
            self._request = _draw_request(self.draw, self.d, self.cmd, region)
        return self._request

    def frame(self) -> bytes:
        return pack_request(self.d, self.request)

    @property
    def default_at(self) -> str:
        if self.cmd is Cmd.HELLO:
            return "connect"
        if self.op.kind == "framing" or self.buffers is None:
            return "after_hello"
        return "after_setup"

    def mutation(self, field: str, data: bytes | Message, *, at: str | None = None,
                 direction: str | None = None, cmd_id: int | None = None, **extra) -> Mutation:
        """The :class:`Mutation` of this site: ``data`` is the wire bytes, or a request message
        to pack; ``extra`` goes into the description (None values are left out)."""
        if not isinstance(data, (bytes, bytearray)):
            data = pack_request(self.d, data)
        cid = cmd_id if cmd_id is not None else self.d.id_of(self.cmd)
        known = self.d.ids.get(cid)
        desc = {"kind": self.op.kind, "what": self.op.what,
                "cmd": known.value if known else f"UNKNOWN_{cid}", "cmd_id": cid,
                "field": field, "dialect": self.d.name,
                "direction": direction or self.op.direction, "at": at or self.default_at}
        desc.update({k: v for k, v in extra.items() if v is not None})
        return Mutation(desc, bytes(data))


def tensor_mutation(what: str, *, fields: tuple[str, ...]):
    """Register ``fn(draw, tensor, region) -> (tensor, attribute, extra)`` as a field
    mutation of one ``rpc_tensor`` slot of every command that carries one (``field`` is
    ``"<slot>.<attribute>"``, e.g. ``"srcs[].data"``, with ``index`` for array slots)."""
    def deco(fn):
        def build(draw, site: MutationSite) -> Mutation:
            msg, region = site.request, site.region
            slot = draw(st.sampled_from(tensor_slots(site.d, site.cmd)))
            index = 0
            if slot == "srcs[]":
                if _get_tensor(msg, slot, 0).id == 0:  # make sure the slot holds a real tensor
                    msg = _replace_tensor(msg, slot, 0, _draw_tensor(draw, region))
            elif slot == "tensors[]":
                index = draw(st.integers(0, len(msg.tensors) - 1))
            t, attr, extra = fn(draw, _get_tensor(msg, slot, index), region)
            if slot.endswith("[]"):
                extra.setdefault("index", index)
            return site.mutation(f"{slot}.{attr}", _replace_tensor(msg, slot, index, t),
                                 **extra)

        mutation("field", what, applies=lambda d, c: bool(tensor_slots(d, c)),
                 fields=lambda d, c: tuple(f"{s}.{f}" for s in tensor_slots(d, c)
                                           for f in fields))(build)
        return fn
    return deco


def _replace_tensor(msg: Message, slot: str, index: int, t: RpcTensor) -> Message:
    if slot.endswith("[]"):
        name = slot[:-2]
        items = list(getattr(msg, name))
        items[index] = t
        return replace(msg, **{name: tuple(items)})
    return replace(msg, **{slot: t})


def _get_tensor(msg: Message, slot: str, index: int) -> RpcTensor:
    return getattr(msg, slot[:-2])[index] if slot.endswith("[]") else getattr(msg, slot)


# ---------------------------------------------------------------- candidates and strategies

def candidates(d: Dialect, kind: str, cmd: Cmd | None = None, *,
               where: Callable[[MutationOp, Cmd | None], bool] | None = None,
               ) -> list[tuple[MutationOp, Cmd | None]]:
    """Every (operator, command) pair of ``kind`` that applies in ``d`` (only ``cmd``'s when
    given; operators on unknown command bytes come last, with command None, only then)."""
    ops = [op for (k, _), op in MUTATIONS.items() if k == kind]
    out = [(op, c) for c in _commands(d, cmd, "request") for op in ops
           if not op.unknown_cmd and op.applies(d, c)]
    if cmd is None:
        out += [(op, None) for op in ops if op.unknown_cmd]
    if where is not None:
        out = [(op, c) for op, c in out if where(op, c)]
    return out


def _only(cands: list, what: str | None, label: str) -> list:
    """Restrict candidates to one operator; refuse one that cannot apply."""
    if what is None:
        return cands
    kept = [(op, c) for op, c in cands if op.what == what]
    if not kept:
        raise ValueError(f"no {label} mutation {what!r} applies here")
    return kept


def _strategy(d: Dialect, cands: list, buffers: Buffers) -> st.SearchStrategy[Mutation]:
    @st.composite
    def build(draw):
        op, c = draw(st.sampled_from(cands))
        return op.build(draw, MutationSite(draw, op, d, c, buffers))
    return build()


def strategy_of(dialect: Dialect | str, kind: str, cmd: Cmd | str | None = None, *,
                what: str | None = None, buffers: Buffers = None,
                where: Callable[[MutationOp, Cmd | None], bool] | None = None,
                ) -> st.SearchStrategy[Mutation]:
    """The mutations of ``kind`` (optionally one command, one operator, or those ``where``
    accepts); ValueError when none applies."""
    d = get_dialect(dialect)
    cands = candidates(d, kind, Cmd(cmd) if cmd is not None else None, where=where)
    if not cands:
        raise ValueError(f"no {kind} mutation applies to {cmd or 'any command'} in dialect "
                         f"{d.name}")
    return _strategy(d, _only(cands, what, kind), buffers)


def mutations(dialect: Dialect | str, *, kinds: Iterable[str] = MUTATION_KINDS,
              buffers: Buffers = None,
              where: Callable[[MutationOp, Cmd | None], bool] | None = None,
              ) -> st.SearchStrategy[Mutation]:
    """Any structured mutation of ``dialect``: one of the kinds in ``kinds`` that has an
    operator here (each kind equally likely, whatever its number of operators), restricted
    further with ``where(op, cmd)``."""
    d = get_dialect(dialect)
    parts = []
    for kind in kinds:
        if kind not in MUTATION_KINDS:
            raise ValueError(f"unknown mutation kind {kind!r}")
        cands = candidates(d, kind, where=where)
        if cands:
            parts.append(_strategy(d, cands, buffers))
    if not parts:
        raise ValueError(f"no mutation applies in dialect {d.name}")
    return st.one_of(parts)


def mutation_catalogue(dialect: Dialect | str) -> list[dict]:
    """Every ``{"kind", "what", "cmd", "direction", "fields"}`` the registered mutations can
    draw for ``dialect`` -- the denominator of a fuzz report's coverage table. Operators on
    unknown command bytes are listed once with ``cmd == "UNKNOWN"`` (their descriptions say
    ``"UNKNOWN_<id>"``)."""
    d = get_dialect(dialect)
    return [{"kind": op.kind, "what": op.what, "cmd": c.value if c else "UNKNOWN",
             "direction": op.direction, "fields": list(op.fields_for(d, c))}
            for kind in MUTATION_KINDS for op, c in candidates(d, kind)]


def check_description(desc: dict) -> None:
    """Raise ValueError unless ``desc`` is a well-formed mutation description.

    ``at`` says where ``data`` goes: ``"connect"`` (first bytes of a fresh connection, or for
    ``direction == "response"`` the answer to the client's HELLO), ``"after_hello"`` (after a
    successful plain HELLO, see :func:`hello_request_frame`), ``"after_setup"`` (after the
    buffers passed to the strategy were allocated on this connection).
    """
    problems = []
    for key, typ in DESCRIPTION_KEYS.items():
        if key not in desc:
            problems.append(f"missing {key!r}")
        elif not isinstance(desc[key], typ) or isinstance(desc[key], bool):
            problems.append(f"{key!r} must be {typ.__name__}, got {desc[key]!r}")
    for key, value in desc.items():
        if key in DESCRIPTION_KEYS:
            continue
        if key not in _OPTIONAL_KEYS:
            problems.append(f"unknown key {key!r}")
        elif (not isinstance(value, _OPTIONAL_KEYS[key])
              or (key != "eof" and isinstance(value, bool))):  # bool is an int subclass
            problems.append(f"{key!r} has the wrong type: {value!r}")
    if not problems:
        if desc["kind"] not in MUTATION_KINDS:
            problems.append(f"unknown kind {desc['kind']!r}")
        elif (desc["kind"], desc["what"]) not in MUTATIONS:
            problems.append(f"unknown {desc['kind']} mutation {desc['what']!r}")
        if desc["direction"] not in ("request", "response"):
            problems.append(f"bad direction {desc['direction']!r}")
        if desc["at"] not in _ATS:
            problems.append(f"bad at {desc['at']!r}")
        if desc["dialect"] not in DIALECTS:
            problems.append(f"unknown dialect {desc['dialect']!r}")
        elif not 0 <= desc["cmd_id"] <= 255:
            problems.append(f"cmd_id {desc['cmd_id']} is not a byte")
        else:
            known = DIALECTS[desc["dialect"]].ids.get(desc["cmd_id"])
            expected = known.value if known is not None else f"UNKNOWN_{desc['cmd_id']}"
            if desc["cmd"] != expected:
                problems.append(f"cmd {desc['cmd']!r} does not match cmd_id {desc['cmd_id']} "
                                f"({expected})")
        if not desc["field"]:
            problems.append("empty field")
    if problems:
        raise ValueError("malformed mutation description: " + "; ".join(problems))
