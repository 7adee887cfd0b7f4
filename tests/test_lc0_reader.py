"""The lc0 protobuf reader: wire format by hand-built bytes, dequantisation, batch-norm folding, and
the real Maia files' layout (lc0's ``describenet``: SE, 6 blocks, 64 filters, conv policy, WDL)."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from allie_jax.convert import lc0
from tests.support.maia_support import maia_dir


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _layer(lo: float, hi: float, codes: list[int]) -> bytes:
    return (
        _field(1, 5, struct.pack("<f", lo))
        + _field(2, 5, struct.pack("<f", hi))
        + _field(3, 2, np.asarray(codes, "<u2").tobytes())
    )


def test_varints_and_wire_types():
    msg = (
        _field(1, 0, _varint(300))
        + _field(2, 0, _varint(2**40 + 7))
        + _field(3, 5, struct.pack("<f", 1.5))
        + _field(4, 1, struct.pack("<d", -2.25))
        + _field(5, 2, b"abc")
        + _field(5, 2, b"")
    )
    fields = lc0.parse_message(msg)
    assert fields[1] == [300]
    assert fields[2] == [2**40 + 7]
    assert struct.unpack("<f", fields[3][0])[0] == 1.5
    assert struct.unpack("<d", fields[4][0])[0] == -2.25
    assert fields[5] == [b"abc", b""]


def test_truncated_message_is_one_clear_error():
    with pytest.raises(lc0.Lc0FormatError, match="past the end"):
        lc0.parse_message(_field(5, 2, b"abcdef")[:-2])
    with pytest.raises(lc0.Lc0FormatError, match="wire type"):
        lc0.parse_message(bytes([3 << 3 | 3]))


def test_linear16_dequantisation_by_hand():
    values = lc0.decode_layer(_layer(-1.0, 3.0, [0, 65535, 16384, 32768]))
    np.testing.assert_allclose(
        values, [-1.0, 3.0, -1 + 4 * 16384 / 65535, -1 + 4 * 32768 / 65535], rtol=1e-7
    )
    assert lc0.decode_layer(None).size == 0


def test_fold_batchnorm_matches_the_unfolded_formula():
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(4, 6)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    block = {
        "weights": w.ravel(),
        "biases": b,
        "bn_means": rng.normal(size=4).astype(np.float32),
        "bn_stddivs": rng.uniform(0.1, 2, size=4).astype(np.float32),
        "bn_gammas": rng.uniform(0.5, 2, size=4).astype(np.float32),
        "bn_betas": rng.normal(size=4).astype(np.float32),
    }
    x = rng.normal(size=6)
    expected = (w @ x + b - block["bn_means"]) / np.sqrt(block["bn_stddivs"] + 1e-5) * block[
        "bn_gammas"
    ] + block["bn_betas"]
    fw, fb = lc0.fold_batchnorm(block)
    np.testing.assert_allclose(fw @ x + fb, expected, rtol=1e-5, atol=1e-5)
    # no batch-norm fields (the conv policy's output layer): weights and biases as stored
    fw, fb = lc0.fold_batchnorm({"weights": w.ravel(), "biases": b})
    np.testing.assert_array_equal(fw, w)
    np.testing.assert_array_equal(fb, b)


def test_not_an_lc0_file(tmp_path):
    bad = tmp_path / "x.pb.gz"
    bad.write_bytes(gzip.compress(_field(2, 2, b"hello")))
    with pytest.raises(lc0.Lc0FormatError, match="magic"):
        lc0.read_lc0(bad)
    with pytest.raises(lc0.Lc0FormatError, match="no such file"):
        lc0.read_lc0(tmp_path / "missing.pb.gz")


def test_real_maia_layout():
    w = lc0.read_lc0(maia_dir() / "maia-1500.pb.gz")
    assert (w.blocks, w.filters) == (6, 64)
    assert w.format.weights_encoding == lc0.LINEAR16
    assert w.format.input == lc0.INPUT_CLASSICAL_112_PLANE
    assert w.format.policy == lc0.POLICY_CONVOLUTION and w.format.value == lc0.VALUE_WDL
    assert w.input["weights"].size == 64 * 112 * 9
    assert w.residual[0]["se"]["w1"].size == 8 * 64 and w.residual[0]["se"]["w2"].size == 128 * 8
    assert w.policy["weights"].size == 80 * 64 * 9 and w.policy["biases"].size == 80
    assert w.value["bn_means"].size == 32
    assert w.ip1_val_w.size == 128 * 2048 and w.ip2_val_b.size == 3
    for block in w.residual:  # batch-norm variances are positive after dequantisation
        assert (block["conv1"]["bn_stddivs"] > 0).all() and (block["conv2"]["bn_stddivs"] > 0).all()
