"""Misbehaviour knobs, one dataclass for both roles (BoringSSL BoGo's ProtocolBugs style).

The default value of every field is "behave". Scenarios and the fuzzer switch single knobs on
to make the reference peer lie, skip, truncate or corrupt exactly one thing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Misbehaviour:
    # --- server side (what a client under test faces)
    hello_version: tuple[int, int, int] | None = None  # announce this version instead of ours
    hello_flags: int | None = None  # HELLO response byte 3 (e.g. unknown bits 0x80, 0xFF)
    hello_caps: bytes | None = None  # 24 conn_caps bytes in the HELLO response
    hello_response_size: int | None = None  # announce this HELLO payload length (malformed)
    claim_cache_hit: bool = False  # answer SET_TENSOR_HASH with 1 without having the data
    stall_on: str | None = None  # command name: never answer it (hang the client)
    close_on: str | None = None  # command name: close the connection instead of answering
    garble_response_len: str | None = None  # command name: answer it with length + 1
    # Planted resource bugs (each proves one `harness fuzz` oracle, see harness/fuzz/oracles):
    amplify_set_tensor: int = 0  # hold this many times each SET_TENSOR payload per connection
    freeze_mid_frame: bool = False  # serve concurrently, but all wait while one is mid-frame
    cache_every_upload: bool = False  # with a cache dir, file every upload whatever cache_flag
    leak_fd_per_connection: bool = False  # open a descriptor per connection, never close it
    spin_on: str | None = None  # command name: burn spin_seconds of CPU before answering it
    spin_seconds: float = 1.0
    # a planted boundary bug (proves the sweep, harness/fuzz/sweep.py): deserialize_tensor
    # accepts a tensor whose data ends up to this many bytes past its buffer's end
    tensor_bounds_slack: int = 0
    # Planted interaction bugs (prove the combinatorial and stateful phases,
    # harness/fuzz/interactions.py and stateful.py): each skips a bounds check only where
    # two or three classes meet, or after an earlier request, so no single-field edge shows
    # it; the access then happens (clamped to the reference's own memory) and is answered.
    # SET/GET/MEMSET_TENSOR: no region check when the tensor is F16 and the offset non-zero
    skip_region_f16_offset: bool = False
    # GET_TENSOR: no region check when the size is the tensor's nbytes - 1
    skip_region_size_nbytes_minus_1: bool = False
    # GRAPH_COMPUTE: no bounds check of a view whose view_src lies in a buffer allocated
    # after the view's own (moving the view itself to another buffer does not meet it)
    skip_view_bounds_cross_buffer: bool = False
    # after a FREE_BUFFER of one buffer, tensors of the connection's others go unchecked
    skip_bounds_after_free: bool = False

    # --- client side (what a server under test faces)
    skip_hello: bool = False
    hello_twice: bool = False
    client_caps: bytes | None = None  # 24 conn_caps bytes in the HELLO request
    cache_flag: int | None = None  # force this cache_flag byte on every SET_TENSOR (e.g. 0xFF)
    hash_policy: str | None = None  # override: "always" | "never" | "if-flag" | "all-sizes"
    truncate_set_tensor_at: int | None = None  # send only this many payload bytes, then close
    trailing_bytes: bytes = b""  # appended after every request frame
    ignore_version: bool = False  # carry on after a version mismatch (bypass the rule)

    extra: dict = field(default_factory=dict)  # free-form for experiments

    def active(self) -> dict:
        """Only the knobs that differ from 'behave', for logs and reports."""
        default = Misbehaviour()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, bytes):
                d[k] = v.hex()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Misbehaviour":
        kw = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name in ("hello_caps", "client_caps", "trailing_bytes") and isinstance(v, str):
                v = bytes.fromhex(v)
            if f.name == "hello_version" and v is not None:
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)


BEHAVE = Misbehaviour()


def parse_knobs(items) -> Misbehaviour:
    """``NAME=VALUE`` strings into a Misbehaviour (ints accept 0x.., bools true/false, versions
    a.b.c, byte knobs hex). Raises ValueError naming an unknown knob."""
    known = {f.name for f in fields(Misbehaviour)}
    values: dict = {}
    for item in items:
        name, _, raw = item.partition("=")
        if name not in known:
            raise ValueError(f"unknown knob {name!r}; known: {', '.join(sorted(known))}")
        raw = raw.strip()
        if raw.lower() in ("true", "false"):
            values[name] = raw.lower() == "true"
        elif name == "hello_version":
            values[name] = tuple(int(x) for x in raw.split("."))
        elif name in ("hello_caps", "client_caps", "trailing_bytes"):
            values[name] = raw
        else:
            try:
                values[name] = int(raw, 0)
            except ValueError:
                values[name] = _float_or_text(raw)
    return Misbehaviour.from_dict(values)


def _float_or_text(raw: str):
    try:
        return float(raw)
    except ValueError:
        return raw
