"""GRAPH_COMPUTE requests: valid chains and DAGs, hostile shapes, deep chains."""

from __future__ import annotations

from hypothesis import strategies as st

from ..proto import ggml
from ..proto.dialects import DEFAULT, Dialect, get_dialect
from ..proto.messages import GraphComputeRequest
from ..proto.tensor import RpcTensor, nbytes
from .basics import (U64_MAX, BufferRegion, Buffers, _BINARY_OPS, _OP_VIEW, _UNARY_OPS,
                     _heap_pointers, _pad_name, _regions, _strides_for, buffer_regions)

GRAPH_SHAPES = ("chain", "dag", "cycle", "duplicate_ids", "dangling")
_VALID_SHAPES = ("chain", "dag")
_GRAPH_REGIONS = buffer_regions(min_size=4096, max_size=1 << 20)


def _post_order(nodes: list[RpcTensor], by_id: dict[int, RpcTensor]) -> list[RpcTensor]:
    """Tensor order of the C client's serialisation (spec 6.1): per node, a depth-first walk
    over ``src[0..9]``, then ``view_src``, then the tensor itself, each tensor once."""
    seen: set[int] = set()
    out: list[RpcTensor] = []
    for node in nodes:
        stack = [(node, False)]
        while stack:  # iterative, so deep generated chains do not hit the recursion limit
            t, expanded = stack.pop()
            if t.id in seen:
                continue
            if expanded:
                seen.add(t.id)
                out.append(t)
                continue
            stack.append((t, True))
            children = [i for i in (*t.src, t.view_src) if i]
            for cid in reversed(children):
                if cid not in seen and cid in by_id:
                    stack.append((by_id[cid], False))
    return out


@st.composite
def graphs(draw, dialect: Dialect | str = DEFAULT, *, shape: str = "valid",
           buffers: Buffers = None,
           max_nodes: int = 6, max_leaves: int = 3,
           device: st.SearchStrategy[int] | None = None) -> GraphComputeRequest:
    """GRAPH_COMPUTE requests (:class:`~harness.proto.GraphComputeRequest`).

    ``shape`` is one of :data:`GRAPH_SHAPES`, ``"valid"`` (chain or dag) or ``"any"``:

    * ``chain``: each node consumes the previous one (plus a leaf for binary ops);
    * ``dag``: each node's sources are any earlier tensors, occasionally through a VIEW node
      (``view_src``/``view_offs`` set, ``data`` inside the viewed tensor);
    * ``cycle``: a valid graph where one node lists itself or a later node as a source;
    * ``duplicate_ids``: a second record reusing an existing id (the server keeps the first);
    * ``dangling``: a ``src`` or ``view_src`` id that no record in ``tensors`` has.

    Nodes are elementwise f32/f16 ops with the COMPUTE flag, leaves have op NONE; the tensor
    array is in the client's post-order and ``use_count`` holds each tensor's consumer count.
    All tensors are placed in one buffer (drawn from ``buffers``, or a plausible one); if
    it is too small, tensors get ``buffer = data = 0``. ``uid`` is non-zero only in dialects
    with graph uids (and then sometimes 0, the "do not cache" value).
    """
    d = get_dialect(dialect)
    if shape not in GRAPH_SHAPES + ("valid", "any"):
        raise ValueError(f"unknown graph shape {shape!r}; known: {', '.join(GRAPH_SHAPES)}")
    region = draw(_regions(buffers, _GRAPH_REGIONS))
    return _draw_graph(draw, d, region, shape=shape, max_nodes=max_nodes, max_leaves=max_leaves,
                       device=device)


def _draw_graph(draw, d: Dialect, region: BufferRegion, *, shape: str = "valid",
                max_nodes: int = 6, max_leaves: int = 3, device=None) -> GraphComputeRequest:
    if shape == "valid":
        shape = draw(st.sampled_from(_VALID_SHAPES))
    elif shape == "any":
        shape = draw(st.sampled_from(GRAPH_SHAPES))
    type_id = draw(st.sampled_from((ggml.TYPE_F32, ggml.TYPE_F16)))
    ne = (draw(st.integers(1, 16)), draw(st.integers(1, 4)), 1, 1)
    nb = _strides_for(type_id, ne)
    proto_t = RpcTensor(type=type_id, ne=ne, nb=nb)
    size = nbytes(proto_t)
    fits = size <= region.size
    slots = (region.size - size) // 32 if fits else 0

    def placed() -> tuple[int, int]:
        if not fits:
            return 0, 0
        return region.handle, region.base + draw(st.integers(0, slots)) * 32

    n_leaves = draw(st.integers(1, max_leaves))
    n_nodes = draw(st.integers(1 if shape != "chain" else 2, max(max_nodes, 2)))
    ids = draw(st.lists(_heap_pointers(16), min_size=n_leaves + n_nodes + 1,
                        max_size=n_leaves + n_nodes + 1, unique=True))
    fresh_id = ids.pop()  # guaranteed unused: for dangling references
    # ggml's own naming of unnamed tensors ("leaf_3", "node_12"); drawing 64-byte names per
    # tensor would triple the cost of a graph for no coverage (names are opaque to the server).
    names = iter([_pad_name(b"leaf_%d" % i) for i in range(n_leaves)]
                 + [_pad_name(b"node_%d" % i) for i in range(n_nodes)])
    leaves = []
    for i in range(n_leaves):
        buf, data = placed()
        leaves.append(proto_t.with_(id=ids[i], buffer=buf, data=data, name=next(names),
                                    flags=ggml.FLAG_INPUT if draw(st.booleans()) else 0))
    made = list(leaves)
    nodes: list[RpcTensor] = []
    for i in range(n_nodes):
        tid = ids[n_leaves + i]
        buf, data = placed()
        if shape == "chain":
            srcs = [made[-1]]
        else:
            srcs = [draw(st.sampled_from(made))]
        if shape != "chain" and fits and draw(st.integers(0, 5)) == 0:
            # A VIEW node: aliases part of its source, data = source data + view_offs.
            src = srcs[0]
            offs = draw(st.integers(0, size // nb[0] - 1)) * nb[0] if src.data else 0
            view_ne = (ne[0] * ne[1] - offs // nb[0], 1, 1, 1) if offs else ne
            t = proto_t.with_(id=tid, buffer=src.buffer, data=src.data + offs if src.data else 0,
                              ne=view_ne, nb=_strides_for(type_id, view_ne), op=_OP_VIEW,
                              view_src=src.id, view_offs=offs, src=(src.id,) + (0,) * 9,
                              flags=ggml.FLAG_COMPUTE, name=next(names))
        else:
            binary = draw(st.booleans())
            if binary:
                srcs.append(draw(st.sampled_from(leaves if shape == "chain" else made)))
            op = draw(st.sampled_from(_BINARY_OPS if binary else _UNARY_OPS))
            src_ids = tuple(s.id for s in srcs)
            t = proto_t.with_(id=tid, buffer=buf, data=data, op=op, flags=ggml.FLAG_COMPUTE,
                              src=src_ids + (0,) * (10 - len(src_ids)), name=next(names))
        made.append(t)
        nodes.append(t)
    if draw(st.booleans()):
        last = nodes[-1]
        nodes[-1] = last.with_(flags=last.flags | ggml.FLAG_OUTPUT)
    by_id = {t.id: t for t in leaves + nodes}
    uses: dict[int, int] = {}
    for t in nodes:
        for s in (*t.src, t.view_src):
            if s:
                uses[s] = uses.get(s, 0) + 1
    tensors = [t.with_(use_count=uses.get(t.id, 0)) for t in _post_order(nodes, by_id)]

    node_ids = {n.id for n in nodes}
    if shape == "cycle":
        k = draw(st.sampled_from([k for k, t in enumerate(tensors) if t.id in node_ids]))
        target = draw(st.sampled_from([t.id for t in tensors[k:]]))  # itself or a later one
        tensors[k] = tensors[k].with_(src=(target,) + tensors[k].src[1:])
    elif shape == "duplicate_ids":
        k = draw(st.integers(0, len(tensors) - 1))
        dup = tensors[k].with_(name=_pad_name(b"duplicate"), use_count=0,
                               data=placed()[1] if fits else 0)
        tensors.insert(draw(st.integers(k + 1, len(tensors))), dup)
    elif shape == "dangling":
        k = draw(st.sampled_from([k for k, t in enumerate(tensors) if t.id in node_ids]))
        t = tensors[k]
        if draw(st.booleans()):
            slot = draw(st.integers(0, 9))
            src = list(t.src)
            src[slot] = fresh_id
            tensors[k] = t.with_(src=tuple(src))
        else:
            tensors[k] = t.with_(view_src=fresh_id)
    uid = 0
    if d.graph_uid:
        uid = draw(st.one_of(st.just(0), st.integers(1, U64_MAX)))
    dev = draw(device) if device is not None else 0
    return GraphComputeRequest(device=dev, uid=uid, nodes=tuple(n.id for n in nodes),
                               tensors=tuple(tensors))


# Chain depths for recursion probing: up to 2**17 nodes (a 38 MB frame), far beyond any real
# graph; "output_only" lists just the chain's last node, so a server that resolves sources
# recursively has to walk the whole chain from there (spec 6.2: depth not specified).
_CHAIN_DEPTHS = (64, 1024, 8192, 1 << 17)
_CHAIN_LISTINGS = ("all", "output_only")


def _deep_chain(depth: int, region: BufferRegion, listing: str = "all") -> GraphComputeRequest:
    """A chain of ``depth`` DUP nodes over one leaf, for recursion-depth probing (spec 6.2).

    ``listing``: ``"all"`` puts every node in ``nodes[]`` in execution order (what a client
    sends), ``"output_only"`` only the last one.
    """
    leaf = RpcTensor.make(id=0x1000, ne=(1,), buffer=region.handle if region.size >= 4 else 0,
                          data=region.base if region.size >= 4 else 0, name="leaf")
    tensors = [leaf]
    prev_id = leaf.id
    dup, compute, zeros9 = ggml.OP["DUP"], ggml.FLAG_COMPUTE, (0,) * 9
    for i in range(depth):
        # The constructor directly: dataclasses.replace per node would dominate deep chains.
        node_id = 0x1000 + 16 * (i + 1)
        tensors.append(RpcTensor(node_id, leaf.type, leaf.buffer, leaf.ne, leaf.nb, dup,
                                 leaf.op_params, compute, (prev_id,) + zeros9, 0, 0, leaf.data,
                                 _pad_name(b"n%d" % i), 1))
        prev_id = node_id
    nodes = tuple(t.id for t in tensors[1:]) if listing == "all" else (prev_id,)
    return GraphComputeRequest(nodes=nodes, tensors=tuple(tensors))
