"""Reader for lc0 network files (``.pb.gz``), written from the public ``net.proto`` field numbers.

An lc0 network is a gzip'd protobuf ``Net`` message. We decode only what a classical
(SE-)ResNet with a convolutional policy head and a WDL value head needs, with a minimal decoder of
the protobuf wire format (varints, 32/64-bit scalars, length-delimited fields): no ``protobuf``
package, no generated code. Field numbers (``lczero-common/proto/net.proto``):

- ``Net``: 1 magic (fixed32), 4 format, 10 weights.
- ``Format``: 1 weights_encoding (1 = LINEAR16), 2 network_format.
- ``NetworkFormat``: 1 input, 2 output, 3 network, 4 policy, 5 value, 6 moves_left.
- ``Weights``: 1 input (ConvBlock), 2 residual (repeated), 3 policy, 4 ip_pol_w, 5 ip_pol_b,
  6 value, 7..10 ip1_val_w/b, ip2_val_w/b, 11 policy1, 12 moves_left, 13..16 ip*_mov_*.
- ``Residual``: 1 conv1, 2 conv2, 3 se. ``SEunit``: 1 w1, 2 b1, 3 w2, 4 b2.
- ``ConvBlock``: 1 weights, 2 biases, 3 bn_means, 4 bn_stddivs, 5 bn_gammas, 6 bn_betas.
- ``Layer``: 1 min_val (float), 2 max_val (float), 3 params (bytes).

A LINEAR16 layer stores uint16 little-endian codes q; its values are
``min_val + (max_val - min_val) * q / 65535``. Every layer carries its own min/max.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct

import numpy as np
from etils import epath

NET_MAGIC = 0x1C0  # lc0 writes this in Net.magic

# Enumerations of NetworkFormat we care about (names from net.proto).
INPUT_CLASSICAL_112_PLANE = 1
NETWORK_SE_WITH_HEADFORMAT = 4
NETWORK_SE = 2
POLICY_CONVOLUTION = 2
VALUE_WDL = 2
LINEAR16 = 1


class Lc0FormatError(ValueError):
    """An lc0 file we cannot read (corrupt, or a network layout this reader does not support)."""


# --- protobuf wire format -------------------------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise Lc0FormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Lc0FormatError("varint longer than 10 bytes")


def parse_message(buf: bytes) -> dict[int, list]:
    """Split one protobuf message into ``{field_number: [values in order]}``.

    Varints come back as ints, fixed32/fixed64 as raw 4/8-byte ``bytes`` (the schema says whether
    they are floats or integers), length-delimited fields as ``bytes`` (sub-messages are parsed by
    the caller, who knows the schema). Groups (wire types 3/4) are not used by lc0 and are refused.
    """
    fields: dict[int, list] = {}
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise Lc0FormatError(f"unsupported protobuf wire type {wire} (field {number})")
        if pos > end:
            raise Lc0FormatError(f"field {number} runs past the end of its message")
        fields.setdefault(number, []).append(value)
    return fields


def _one(fields: dict[int, list], number: int, default=None):
    values = fields.get(number)
    return values[-1] if values else default  # protobuf: the last occurrence wins


def _float32(raw: bytes) -> float:
    return struct.unpack("<f", raw)[0]


# --- lc0 messages -------------------------------------------------------------------------------


def decode_layer(buf: bytes | None) -> np.ndarray:
    """A LINEAR16 ``Layer`` → float32 values (empty when the layer is absent)."""
    if buf is None:
        return np.zeros((0,), np.float32)
    fields = parse_message(buf)
    params = _one(fields, 3, b"")
    if len(params) % 2:
        raise Lc0FormatError(f"layer params have an odd byte count ({len(params)})")
    codes = np.frombuffer(params, dtype="<u2").astype(np.float64)
    lo = _float32(_one(fields, 1, b"\0\0\0\0"))
    hi = _float32(_one(fields, 2, b"\0\0\0\0"))
    return (lo + (hi - lo) * (codes / 65535.0)).astype(np.float32)


CONV_FIELDS = {
    1: "weights",
    2: "biases",
    3: "bn_means",
    4: "bn_stddivs",
    5: "bn_gammas",
    6: "bn_betas",
}
SE_FIELDS = {1: "w1", 2: "b1", 3: "w2", 4: "b2"}


def _decode_block(buf: bytes | None, names: dict[int, str]) -> dict[str, np.ndarray]:
    if buf is None:
        return {}
    fields = parse_message(buf)
    return {name: decode_layer(_one(fields, number)) for number, name in names.items()}


@dataclasses.dataclass(frozen=True)
class NetworkFormat:
    """The ``NetworkFormat`` enums (raw ints; see net.proto) plus the weight encoding."""

    weights_encoding: int
    input: int
    output: int
    network: int
    policy: int
    value: int
    moves_left: int


@dataclasses.dataclass(frozen=True)
class Lc0Weights:
    """Dequantised float32 weights of a classical lc0 network, in lc0's own layouts.

    Conv weights are ``[out, in, 3|1, 3|1]`` flattened (reshape with ``conv_shape``); dense weights
    ``[out, in]`` flattened. ``residual`` is one dict per block with ``conv1``, ``conv2`` (ConvBlock
    dicts) and ``se`` (SEunit dict, empty for a plain ResNet).
    """

    format: NetworkFormat
    input: dict[str, np.ndarray]
    residual: list[dict[str, dict[str, np.ndarray]]]
    policy1: dict[str, np.ndarray]
    policy: dict[str, np.ndarray]
    ip_pol_w: np.ndarray
    ip_pol_b: np.ndarray
    value: dict[str, np.ndarray]
    ip1_val_w: np.ndarray
    ip1_val_b: np.ndarray
    ip2_val_w: np.ndarray
    ip2_val_b: np.ndarray

    @property
    def filters(self) -> int:
        return conv_outputs(self.input)

    @property
    def blocks(self) -> int:
        return len(self.residual)


def _decode_format(buf: bytes | None) -> NetworkFormat:
    fields = parse_message(buf) if buf is not None else {}
    encoding = _one(fields, 1, 0)
    nf_buf = _one(fields, 2)
    nf = parse_message(nf_buf) if nf_buf is not None else {}
    # A missing network_format means classical 112-plane input, classical output and network.
    return NetworkFormat(
        weights_encoding=encoding,
        input=_one(nf, 1, 1),
        output=_one(nf, 2, 1),
        network=_one(nf, 3, 1),
        policy=_one(nf, 4, 1),
        value=_one(nf, 5, 1),
        moves_left=_one(nf, 6, 0),
    )


def parse_net(data: bytes, *, name: str = "<bytes>") -> Lc0Weights:
    """Decode an uncompressed ``Net`` message; ``name`` goes into error messages."""
    try:
        net = parse_message(data)
    except Lc0FormatError as e:
        raise Lc0FormatError(f"{name}: not an lc0 protobuf ({e})") from None
    magic_raw = _one(net, 1)
    if magic_raw is None or struct.unpack("<I", magic_raw)[0] != NET_MAGIC:
        raise Lc0FormatError(f"{name}: missing lc0 magic number (not an lc0 network)")
    fmt = _decode_format(_one(net, 4))
    if fmt.weights_encoding != LINEAR16:
        raise Lc0FormatError(f"{name}: weight encoding {fmt.weights_encoding}, expected LINEAR16")
    w_buf = _one(net, 10)
    if w_buf is None:
        raise Lc0FormatError(f"{name}: no weights")
    w = parse_message(w_buf)
    residual = []
    for block in w.get(2, []):
        b = parse_message(block)
        residual.append(
            {
                "conv1": _decode_block(_one(b, 1), CONV_FIELDS),
                "conv2": _decode_block(_one(b, 2), CONV_FIELDS),
                "se": _decode_block(_one(b, 3), SE_FIELDS),
            }
        )
    return Lc0Weights(
        format=fmt,
        input=_decode_block(_one(w, 1), CONV_FIELDS),
        residual=residual,
        policy1=_decode_block(_one(w, 11), CONV_FIELDS),
        policy=_decode_block(_one(w, 3), CONV_FIELDS),
        ip_pol_w=decode_layer(_one(w, 4)),
        ip_pol_b=decode_layer(_one(w, 5)),
        value=_decode_block(_one(w, 6), CONV_FIELDS),
        ip1_val_w=decode_layer(_one(w, 7)),
        ip1_val_b=decode_layer(_one(w, 8)),
        ip2_val_w=decode_layer(_one(w, 9)),
        ip2_val_b=decode_layer(_one(w, 10)),
    )


def read_lc0(path: str | os.PathLike) -> Lc0Weights:
    """Read an lc0 ``.pb.gz`` (or uncompressed ``.pb``) network file."""
    path = epath.Path(path)
    if not path.exists():
        raise Lc0FormatError(f"{path}: no such file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise Lc0FormatError(f"{path}: corrupt gzip ({e})") from None
    return parse_net(raw, name=str(path))


def conv_outputs(block: dict[str, np.ndarray]) -> int:
    """Output channels of a ConvBlock (nets trained with batch norm store no conv biases)."""
    return int(max(block.get("biases", np.zeros(0)).size, block.get("bn_means", np.zeros(0)).size))


def fold_batchnorm(
    block: dict[str, np.ndarray], eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray]:
    """One ConvBlock → (weights ``[out, in*k*k]``, bias ``[out]``) with batch norm folded in.

    lc0's ``bn_stddivs`` field holds variances:
    ``y = gamma * (conv(x) + bias - mean) / sqrt(var + eps) + beta``. A block without batch-norm
    fields (the convolutional policy's last layer) is returned as is.
    """
    weights, out = block["weights"], conv_outputs(block)
    biases = block.get("biases", np.zeros(0))
    if biases.size == 0:
        biases = np.zeros(out, np.float32)
    if out == 0 or weights.size % out:
        raise Lc0FormatError(f"conv block: {weights.size} weights do not split into {out} outputs")
    weights = weights.reshape(out, -1).astype(np.float64)
    biases = biases.astype(np.float64)
    means = block.get("bn_means", np.zeros(0))
    if means.size == 0:
        return weights.astype(np.float32), biases.astype(np.float32)
    var = block["bn_stddivs"].astype(np.float64)
    gammas = block.get("bn_gammas", np.zeros(0)).astype(np.float64)
    betas = block.get("bn_betas", np.zeros(0)).astype(np.float64)
    if gammas.size == 0:
        gammas = np.ones(out)
    if betas.size == 0:
        betas = np.zeros(out)
    scale = gammas / np.sqrt(var + eps)
    return (weights * scale[:, None]).astype(np.float32), (scale * (biases - means) + betas).astype(
        np.float32
    )
