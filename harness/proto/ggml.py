"""ggml enums and type traits the wire protocol depends on (spec appendix A).

Ids are positional in ggml.h, so they are kept as ordered tuples: the index is the id. A
:class:`Numbering` is one ggml tree's pair of tables; every dialect names the numbering it
uses (``Dialect.numbering``). Every table here was read from a real build's library and
header (tests/test_ggml_numbering.py holds each pin to its dialect's table): the 3.6.1 and
4.0.2 trees number their ops differently from 7.0.0; 5.0.0 to 8.0.0 share 7.0.0's tables. A
new numbering is one more ``Numbering(...)`` entry in ``NUMBERINGS``. The
module-level names (``TYPES``, ``OPS``, ``OP``, ...) are the 7.0.0 tables, for callers that
have no dialect at hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, NamedTuple


class TypeTraits(NamedTuple):
    name: str
    type_size: int  # bytes per block
    blck_size: int  # elements per block; 0 = removed type (server rejects it)


_REMOVED = TypeTraits("removed", 0, 0)

# ggml_type, ids 0..42 (GGML_TYPE_COUNT = 43 in 7.0.0).
TYPES: tuple[TypeTraits, ...] = (
    TypeTraits("f32", 4, 1), TypeTraits("f16", 2, 1), TypeTraits("q4_0", 18, 32),
    TypeTraits("q4_1", 20, 32), _REMOVED, _REMOVED, TypeTraits("q5_0", 22, 32),
    TypeTraits("q5_1", 24, 32), TypeTraits("q8_0", 34, 32), TypeTraits("q8_1", 36, 32),
    TypeTraits("q2_K", 84, 256), TypeTraits("q3_K", 110, 256), TypeTraits("q4_K", 144, 256),
    TypeTraits("q5_K", 176, 256), TypeTraits("q6_K", 210, 256), TypeTraits("q8_K", 292, 256),
    TypeTraits("iq2_xxs", 66, 256), TypeTraits("iq2_xs", 74, 256), TypeTraits("iq3_xxs", 98, 256),
    TypeTraits("iq1_s", 50, 256), TypeTraits("iq4_nl", 18, 32), TypeTraits("iq3_s", 110, 256),
    TypeTraits("iq2_s", 82, 256), TypeTraits("iq4_xs", 136, 256), TypeTraits("i8", 1, 1),
    TypeTraits("i16", 2, 1), TypeTraits("i32", 4, 1), TypeTraits("i64", 8, 1),
    TypeTraits("f64", 8, 1), TypeTraits("iq1_m", 56, 256), TypeTraits("bf16", 2, 1),
    _REMOVED, _REMOVED, _REMOVED, TypeTraits("tq1_0", 54, 256), TypeTraits("tq2_0", 66, 256),
    _REMOVED, _REMOVED, _REMOVED, TypeTraits("mxfp4", 17, 32), TypeTraits("nvfp4", 36, 64),
    TypeTraits("q1_0", 18, 128), TypeTraits("q2_0", 18, 64),
)
TYPE_COUNT = len(TYPES)
assert TYPE_COUNT == 43

TYPE_F32, TYPE_F16, TYPE_Q4_0, TYPE_I8, TYPE_I32, TYPE_BF16 = 0, 1, 2, 24, 26, 30

# ggml_op, ids 0..100 (GGML_OP_COUNT = 101 in 7.0.0; the RPC patch level tracks it).
OPS: tuple[str, ...] = (
    "NONE", "DUP", "ADD", "ADD_ID", "ADD1", "ACC", "SUB", "MUL",
    "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SUM", "SUM_ROWS",
    "CUMSUM", "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT", "REPEAT_BACK", "CONCAT", "SILU_BACK",
    "NORM", "RMS_NORM", "RMS_NORM_BACK", "GROUP_NORM", "L2_NORM", "MUL_MAT", "MUL_MAT_ID", "OUT_PROD",
    "SCALE", "SET", "CPY", "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE",
    "GET_ROWS", "GET_ROWS_BACK", "SET_ROWS", "DIAG", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX",
    "SOFT_MAX_BACK", "ROPE", "ROPE_BACK", "CLAMP", "CONV_TRANSPOSE_1D", "IM2COL", "IM2COL_BACK",
    "IM2COL_3D", "COL2IM_1D", "CONV_2D", "CONV_3D", "CONV_2D_DW", "CONV_TRANSPOSE_2D", "POOL_1D",
    "POOL_2D", "POOL_2D_BACK", "UPSCALE", "PAD", "PAD_REFLECT_1D", "ROLL", "ARANGE",
    "TIMESTEP_EMBEDDING", "ARGSORT", "TOP_K", "LEAKY_RELU", "TRI", "FILL", "FLASH_ATTN_EXT",
    "FLASH_ATTN_BACK", "SSM_CONV", "SSM_SCAN", "WIN_PART", "WIN_UNPART", "GET_REL_POS",
    "ADD_REL_POS", "RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7", "SOLVE_TRI", "GATED_DELTA_NET",
    "LIGHTNING_INDEXER", "DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST", "UNARY", "MAP_CUSTOM1",
    "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM", "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK",
    "OPT_STEP_ADAMW", "OPT_STEP_SGD", "GLU",
)
OP_COUNT = len(OPS)
assert OP_COUNT == 101
OP = {name: i for i, name in enumerate(OPS)}

# GGML_TENSOR_FLAG_*
FLAG_INPUT, FLAG_OUTPUT, FLAG_PARAM, FLAG_LOSS, FLAG_COMPUTE = 1, 2, 4, 8, 16

MAX_DIMS = 4
MAX_SRC = 10
MAX_OP_PARAMS = 64  # bytes
MAX_NAME = 64



@dataclass(frozen=True)
class Numbering:
    """One ggml tree's ``ggml_type`` and ``ggml_op`` enums (positional: index = id)."""

    name: str  # the ggml tree the tables were read from
    types: tuple[TypeTraits, ...]
    ops: tuple[str, ...]
    op: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "op", MappingProxyType({n: i for i, n in enumerate(self.ops)}))

    @property
    def type_count(self) -> int:
        return len(self.types)

    @property
    def op_count(self) -> int:
        return len(self.ops)

    def type_traits(self, type_id: int) -> TypeTraits | None:
        """Traits of a type id, or None when the id is outside the enum."""
        if 0 <= type_id < len(self.types):
            return self.types[type_id]
        return None

    def op_name(self, op_id: int) -> str:
        """The op's name, or its number when it is outside the enum."""
        return self.ops[op_id] if 0 <= op_id < len(self.ops) else str(op_id)

    def row_size(self, type_id: int, ne0: int) -> int:
        """Bytes of one contiguous row of ``ne0`` elements (ggml_row_size)."""
        t = self.types[type_id]
        return t.type_size * ne0 // t.blck_size

    def contiguous_strides(self, type_id: int, ne: tuple[int, ...]) -> tuple[int, int, int, int]:
        """nb[] of a freshly created contiguous tensor (ggml_new_tensor_impl)."""
        t = self.types[type_id]
        nb0 = t.type_size
        nb1 = nb0 * (ne[0] // t.blck_size)
        nb2 = nb1 * ne[1]
        nb3 = nb2 * ne[2]
        return (nb0, nb1, nb2, nb3)


GGML_7 = Numbering("7.0.0", TYPES, OPS)  # also 5.0.0, 6.0.0 and 8.0.0 (b11739) [V]
# The older trees lack ops that 7.0.0 inserted in the middle of the enum, so every later id
# shifts: the same op number means another op across them [V: p3, p4 headers and libraries].
GGML_402 = Numbering("4.0.2", TYPES, tuple(
    o for o in OPS if o not in {"DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST"}))
GGML_361 = Numbering("3.6.1", TYPES[:41], tuple(
    o for o in GGML_402.ops if o not in {"COL2IM_1D", "LIGHTNING_INDEXER"}))
NUMBERINGS: dict[str, Numbering] = {n.name: n for n in (GGML_361, GGML_402, GGML_7)}

# The 7.0.0 tree's helpers under their historical module-level names.
type_traits = GGML_7.type_traits
row_size = GGML_7.row_size
contiguous_strides = GGML_7.contiguous_strides
