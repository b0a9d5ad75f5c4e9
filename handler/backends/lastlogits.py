"""The builder's decoder graph rewritten to compute logits for one position per row: a prompt's step needs only
its last token's, and the language-model head over every prompt position is most of a prefill's work (Qwen3's
151,936-entry vocabulary: 155 M multiply-adds a token, more than an 8-layer body's ~110 M) and its largest buffer
(4 bytes x vocab x tokens: 155 MB for 256 tokens).

`last_logits_model(model_bytes)` returns the ModelProto with the node that writes `logits` fed by
`GatherND(hidden, logits_rows, batch_dims=1)` (`logits_rows`: int64 [batch, 1], the position of each row's
last real token): `logits` becomes [batch, vocab]. The head node itself (MatMul or MatMulNBits, its weights and
attributes) is kept byte for byte. Written against the protobuf wire format (field numbers from onnx.proto3):
the `onnx` package is pack-time only (tests/unit/test_layout.py), and this edits four fields of an ~90 KB graph.
A graph built with the builder's `prune_lm_head` (infra.pack.lm_pack) already takes one position, the last of the
padded batch; the GatherND then reads the hidden states before that Gather, so each row still gets its own.
"""

from __future__ import annotations

LOGITS = "logits"
ROWS = "logits_rows"
_GATHERED = "logits_rows/hidden"
PRUNED = "/prune/Unsqueeze/output_0"  # the head's input in a graph built with prune_lm_head (the builder's names)
# onnx.proto3 field numbers
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INPUT, GRAPH_OUTPUT = 1, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP, NODE_ATTR, NODE_DOMAIN = 1, 2, 3, 4, 5, 7
ATTR_NAME, ATTR_I, ATTR_TYPE, ATTR_INT = 1, 3, 20, 2
VALUE_NAME, VALUE_TYPE = 1, 2
TYPE_TENSOR, TENSOR_ELEM, TENSOR_SHAPE, SHAPE_DIM, DIM_VALUE, DIM_PARAM = 1, 1, 2, 1, 1, 2
INT64, FLOAT = 7, 1


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """(field number, wire type, payload, the field's whole bytes) for each field of a message, in order."""
    out, at = [], 0
    while at < len(data):
        start = at
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(data, at)
            payload = b""
        elif wire == 2:
            length, at = _varint(data, at)
            payload, at = data[at : at + length], at + length
        elif wire == 1:
            payload, at = data[at : at + 8], at + 8
        elif wire == 5:
            payload, at = data[at : at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire} (groups) is not in an ONNX model")
        out.append((number, wire, payload, data[start:at]))
    return out


def _enc_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    raw = payload.encode() if isinstance(payload, str) else payload
    return _enc_varint(number << 3 | 2) + _enc_varint(len(raw)) + raw


def _int_field(number: int, value: int) -> bytes:
    return _enc_varint(number << 3) + _enc_varint(value)


def _strings(fields: list[tuple[int, int, bytes, bytes]], number: int) -> list[str]:
    return [payload.decode() for n, wire, payload, _ in fields if n == number and wire == 2]


def _tensor_type(elem: int, dims: list[int | str] | None) -> bytes:
    """A tensor type; `dims` None: no shape (the rank too is left to inference)."""
    if dims is None:
        return _field(TYPE_TENSOR, _int_field(TENSOR_ELEM, elem))
    shape = b"".join(
        _field(SHAPE_DIM, _int_field(DIM_VALUE, d) if isinstance(d, int) else _field(DIM_PARAM, d)) for d in dims
    )
    return _field(TYPE_TENSOR, _int_field(TENSOR_ELEM, elem) + _field(TENSOR_SHAPE, shape))


def _int_attribute(node: list[tuple[int, int, bytes, bytes]], name: str) -> int | None:
    """The int attribute `name` of a node's fields, or None."""
    for number, _, payload, _ in node:
        attr = _fields(payload) if number == NODE_ATTR else []
        if _strings(attr, ATTR_NAME) == [name]:
            for field, wire, _, whole in attr:
                if field == ATTR_I and wire == 0:
                    return _varint(whole, _varint(whole, 0)[1])[0]
    return None


def last_logits_model(model: bytes) -> bytes:
    """See the module docstring; ValueError when the graph has no single node writing `logits`."""
    top = _fields(model)
    graphs = [f for f in top if f[0] == MODEL_GRAPH]
    if len(graphs) != 1:
        raise ValueError("not one graph in the model")
    graph = _fields(graphs[0][2])
    heads = [f for f in graph if f[0] == GRAPH_NODE and _strings(_fields(f[2]), NODE_OUTPUT) == [LOGITS]]
    if len(heads) != 1:
        raise ValueError(f"not one node writing {LOGITS!r}")
    head = _fields(heads[0][2])
    hidden = _strings(head, NODE_INPUT)[0]
    if hidden.endswith(PRUNED):  # built with prune_lm_head: its Gather(-1) reads the padded last position, not
        # each row's last real token; the GatherND below reads the hidden states that Gather was given instead
        gathers = [
            _strings(fields, NODE_INPUT)[0]
            for f in graph
            if f[0] == GRAPH_NODE
            and _strings(fields := _fields(f[2]), NODE_OUTPUT) == [hidden[: -len(PRUNED)] + "/prune/Gather/output_0"]
        ]
        if len(gathers) != 1:
            raise ValueError("a pruned head whose Gather is not the builder's")
        hidden = gathers[0]
    gather = (
        _field(NODE_INPUT, hidden)
        + _field(NODE_INPUT, ROWS)
        + _field(NODE_OUTPUT, _GATHERED)
        + _field(NODE_NAME, "logits_rows/GatherND")
        + _field(NODE_OP, "GatherND")
        + _field(NODE_ATTR, _field(ATTR_NAME, "batch_dims") + _int_field(ATTR_I, 1) + _int_field(ATTR_TYPE, ATTR_INT))
    )
    first = True
    node = b""
    for number, _, _, whole in head:  # the head as it was, its first input the gathered rows
        if number == NODE_INPUT and first:
            node += _field(NODE_INPUT, _GATHERED)
            first = False
        else:
            node += whole
    rows_input = _field(VALUE_NAME, ROWS) + _field(VALUE_TYPE, _tensor_type(INT64, ["batch_size", 1]))
    # A head with an N attribute (MatMulNBits, the pack's Q8MatMul) states the vocabulary: declared, because a
    # custom op's output has no shape inference, and the engine reads the vocabulary from this output's shape.
    vocab = _int_attribute(head, "N")
    logits_type = _tensor_type(FLOAT, ["batch_size", vocab] if vocab else None)
    rebuilt = b""
    for number, _, payload, whole in graph:
        if whole is heads[0][3]:
            rebuilt += _field(GRAPH_NODE, gather) + _field(GRAPH_NODE, node)
        elif number == GRAPH_OUTPUT and _strings(_fields(payload), VALUE_NAME) == [LOGITS]:
            rebuilt += _field(GRAPH_OUTPUT, _field(VALUE_NAME, LOGITS) + _field(VALUE_TYPE, logits_type))
        else:
            rebuilt += whole
    rebuilt += _field(GRAPH_INPUT, rows_input)
    return b"".join(_field(MODEL_GRAPH, rebuilt) if f is graphs[0] else f[3] for f in top)
