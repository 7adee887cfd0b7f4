"""Maia-1 (McIlroy-Young et al., KDD 2020) in Flax NNX: an lc0 SE-ResNet read from its ``.pb.gz``.

Architecture (what the files contain: 6 blocks × 64 filters, SE ratio 8): a 3×3 input convolution
(112 → 64), residual blocks of two 3×3 convolutions with a squeeze-and-excitation unit
(``x·sigmoid(γ) + β`` with γ, β from two dense layers over the channel means), a convolutional
policy head (3×3 conv + ReLU, 3×3 conv to 80 planes, gathered to lc0's 1,858 moves) and a WDL
value head (1×1 conv to 32, dense 2048 → 128 + ReLU, dense 128 → 3). Batch norm is folded into the
convolutions at load time, as lc0 does, so inference is convolutions, biases and ReLUs only.

Layouts: activations are NHWC (H = rank, W = file, both from the mover's view); lc0 stores conv
weights OIHW and dense weights ``[out, in]``; the flatten before the value head and the policy
gather are permuted at load time so they read NHWC directly.

Maia's rating conditioning is the choice of network: ``MaiaSet`` holds the nine and picks the
nearest to a player's rating (``Maia*``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from allie_jax.baselines import lc0_moves
from allie_jax.baselines.lc0_planes import NUM_PLANES
from allie_jax.convert import lc0 as lc0_reader

MAIA_ELOS = tuple(range(1100, 2000, 100))
VALUE_CHANNELS = 32
VALUE_HIDDEN = 128


@dataclasses.dataclass(frozen=True)
class MaiaConfig:
    """Shape of an lc0 SE-ResNet with a conv policy head and a WDL value head."""

    family: ClassVar[str] = "maia"  # the model family registry's name (model/family.py)
    blocks: int = 6
    filters: int = 64
    se_channels: int = 8


def _conv(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(1, 1),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=jax.lax.Precision.HIGHEST,
    )
    return y + b


def _dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST) + b


def _p(rngs: nnx.Rngs, *shape: int) -> nnx.Param:
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * 0.05)


class ResidualBlock(nnx.Module):
    def __init__(self, filters: int, se_channels: int, rngs: nnx.Rngs):
        self.w1, self.b1 = _p(rngs, 3, 3, filters, filters), _p(rngs, filters)
        self.w2, self.b2 = _p(rngs, 3, 3, filters, filters), _p(rngs, filters)
        self.se_w1, self.se_b1 = _p(rngs, filters, se_channels), _p(rngs, se_channels)
        self.se_w2, self.se_b2 = _p(rngs, se_channels, 2 * filters), _p(rngs, 2 * filters)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.nn.relu(_conv(x, self.w1[...], self.b1[...]))
        y = _conv(y, self.w2[...], self.b2[...])
        pooled = y.mean(axis=(1, 2))
        s = jax.nn.relu(_dense(pooled, self.se_w1[...], self.se_b1[...]))
        s = _dense(s, self.se_w2[...], self.se_b2[...])
        gamma, beta = jnp.split(s, 2, axis=-1)
        y = y * jax.nn.sigmoid(gamma)[:, None, None, :] + beta[:, None, None, :]
        return jax.nn.relu(y + x)


class MaiaNet(nnx.Module):
    """``net(planes [B, 112, 8, 8]) -> (policy_logits [B, 1858], wdl_logits [B, 3])``.

    Policy logits are lc0's raw outputs (index order of ``lc0_moves.lc0_moves()``), WDL logits are
    pre-softmax (win, draw, loss) from the side to move's view.
    """

    def __init__(self, config: MaiaConfig = MaiaConfig(), *, rngs: nnx.Rngs | None = None):
        rngs = rngs or nnx.Rngs(0)
        f = config.filters
        self.config = config
        self.in_w, self.in_b = _p(rngs, 3, 3, NUM_PLANES, f), _p(rngs, f)
        self.blocks = nnx.List(
            [ResidualBlock(f, config.se_channels, rngs) for _ in range(config.blocks)]
        )
        self.pol1_w, self.pol1_b = _p(rngs, 3, 3, f, f), _p(rngs, f)
        self.pol_w = _p(rngs, 3, 3, f, lc0_moves.NUM_POLICY_PLANES)
        self.pol_b = _p(rngs, lc0_moves.NUM_POLICY_PLANES)
        self.val_w, self.val_b = _p(rngs, 1, 1, f, VALUE_CHANNELS), _p(rngs, VALUE_CHANNELS)
        self.ip1_w, self.ip1_b = _p(rngs, 64 * VALUE_CHANNELS, VALUE_HIDDEN), _p(rngs, VALUE_HIDDEN)
        self.ip2_w, self.ip2_b = _p(rngs, VALUE_HIDDEN, 3), _p(rngs, 3)

    def __call__(self, planes: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jnp.transpose(planes.astype(jnp.float32), (0, 2, 3, 1))  # NCHW -> NHWC
        x = jax.nn.relu(_conv(x, self.in_w[...], self.in_b[...]))
        for block in self.blocks:
            x = block(x)
        p = jax.nn.relu(_conv(x, self.pol1_w[...], self.pol1_b[...]))
        p = _conv(p, self.pol_w[...], self.pol_b[...])  # [B, 8, 8, 80]
        policy = p.reshape(p.shape[0], -1)[:, _policy_gather()]
        v = jax.nn.relu(_conv(x, self.val_w[...], self.val_b[...]))
        v = jax.nn.relu(_dense(v.reshape(v.shape[0], -1), self.ip1_w[...], self.ip1_b[...]))
        wdl = _dense(v, self.ip2_w[...], self.ip2_b[...])
        return policy, wdl


@functools.cache
def _policy_gather() -> np.ndarray:
    """For each lc0 index, its position in the NHWC-flattened ``[8, 8, 80]`` conv output."""
    table = lc0_moves.conv_policy_map()
    gather = np.zeros(lc0_moves.NUM_LC0_MOVES, np.int32)
    for flat, j in enumerate(table):
        if j >= 0:
            plane, sq = divmod(flat, 64)
            gather[j] = sq * lc0_moves.NUM_POLICY_PLANES + plane
    return gather


# --- lc0 weights -> parameters --------------------------------------------------------------------


def _conv_params(block: dict[str, np.ndarray], in_ch: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    w, b = lc0_reader.fold_batchnorm(block)
    w = w.reshape(-1, in_ch, k, k).transpose(2, 3, 1, 0)  # OIHW -> HWIO
    return w, b


def _dense_params(w: np.ndarray, b: np.ndarray, in_dim: int) -> tuple[np.ndarray, np.ndarray]:
    return w.reshape(-1, in_dim).T, b


def _check(name: str, condition: bool, what: str) -> None:
    if not condition:
        raise lc0_reader.Lc0FormatError(f"{name}: {what}")


def from_lc0(weights: lc0_reader.Lc0Weights, *, name: str = "network") -> MaiaNet:
    """Build a ``MaiaNet`` from decoded lc0 weights (SE-ResNet, conv policy, WDL value only)."""
    fmt = weights.format
    _check(
        name,
        fmt.input == lc0_reader.INPUT_CLASSICAL_112_PLANE,
        f"input format {fmt.input}, need classical 112-plane",
    )
    _check(
        name,
        fmt.policy == lc0_reader.POLICY_CONVOLUTION,
        f"policy format {fmt.policy}, need convolutional",
    )
    _check(name, fmt.value == lc0_reader.VALUE_WDL, f"value format {fmt.value}, need WDL")
    _check(name, weights.blocks > 0 and all(r["se"] for r in weights.residual), "need an SE-ResNet")
    f = weights.filters
    se = weights.residual[0]["se"]["b1"].size
    net = MaiaNet(MaiaConfig(blocks=weights.blocks, filters=f, se_channels=se), rngs=nnx.Rngs(0))

    def put(param: nnx.Param, value: np.ndarray, what: str) -> None:
        _check(
            name,
            tuple(param.shape) == value.shape,
            f"{what} has shape {value.shape}, expected {tuple(param.shape)}",
        )
        param[...] = jnp.asarray(value, jnp.float32)

    try:
        w, b = _conv_params(weights.input, NUM_PLANES, 3)
        put(net.in_w, w, "input conv"), put(net.in_b, b, "input bias")
        for i, (blk, res) in enumerate(zip(net.blocks, weights.residual, strict=True)):
            w, b = _conv_params(res["conv1"], f, 3)
            put(blk.w1, w, f"block {i} conv1"), put(blk.b1, b, f"block {i} conv1 bias")
            w, b = _conv_params(res["conv2"], f, 3)
            put(blk.w2, w, f"block {i} conv2"), put(blk.b2, b, f"block {i} conv2 bias")
            w, b = _dense_params(res["se"]["w1"], res["se"]["b1"], f)
            put(blk.se_w1, w, f"block {i} se w1"), put(blk.se_b1, b, f"block {i} se b1")
            w, b = _dense_params(res["se"]["w2"], res["se"]["b2"], se)
            put(blk.se_w2, w, f"block {i} se w2"), put(blk.se_b2, b, f"block {i} se b2")
        w, b = _conv_params(weights.policy1, f, 3)
        put(net.pol1_w, w, "policy conv1"), put(net.pol1_b, b, "policy conv1 bias")
        w, b = _conv_params(weights.policy, f, 3)
        put(net.pol_w, w, "policy conv2"), put(net.pol_b, b, "policy conv2 bias")
        w, b = _conv_params(weights.value, f, 1)
        put(net.val_w, w, "value conv"), put(net.val_b, b, "value conv bias")
        # lc0 flattens the value conv channel-major (c·64 + sq); we flatten NHWC (sq·32 + c).
        ip1 = weights.ip1_val_w.reshape(VALUE_HIDDEN, VALUE_CHANNELS, 64).transpose(2, 1, 0)
        put(net.ip1_w, ip1.reshape(64 * VALUE_CHANNELS, VALUE_HIDDEN), "value dense 1")
        put(net.ip1_b, weights.ip1_val_b, "value dense 1 bias")
        w, b = _dense_params(weights.ip2_val_w, weights.ip2_val_b, VALUE_HIDDEN)
        put(net.ip2_w, w, "value dense 2"), put(net.ip2_b, b, "value dense 2 bias")
    except ValueError as e:  # reshape of a layer with the wrong size
        if isinstance(e, lc0_reader.Lc0FormatError):
            raise
        raise lc0_reader.Lc0FormatError(
            f"{name}: layer sizes do not fit the SE-ResNet ({e})"
        ) from None
    return net


def load_maia(path: str | os.PathLike) -> MaiaNet:
    """Read one Maia (any lc0 SE-ResNet with conv policy + WDL) ``.pb.gz`` into a ``MaiaNet``."""
    return from_lc0(lc0_reader.read_lc0(path), name=str(path))


# --- batched, jitted inference --------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, planes):
    """One compiled program per architecture and batch size, shared by all nine networks."""
    return nnx.merge(graphdef, state)(planes)


class MaiaPredictor:
    """Batched inference with fixed batch buckets (one compilation per bucket size)."""

    def __init__(self, net: MaiaNet, batch_size: int = 256):
        self.net = net
        self.batch_size = batch_size
        self._graphdef, self._state = nnx.split(net)

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``[N, 112, 8, 8]`` → (policy logits ``[N, 1858]``, WDL probabilities ``[N, 3]``)."""
        n = len(planes)
        pols, wdls = [], []
        for start in range(0, n, self.batch_size):
            chunk = planes[start : start + self.batch_size]
            size = _bucket(len(chunk), self.batch_size)
            padded = np.zeros((size, *chunk.shape[1:]), np.float32)
            padded[: len(chunk)] = chunk
            pol, wdl = _forward(self._graphdef, self._state, jnp.asarray(padded))
            pols.append(np.asarray(pol)[: len(chunk)])
            wdls.append(np.asarray(jax.nn.softmax(wdl, axis=-1))[: len(chunk)])
        if not pols:
            return np.zeros((0, lc0_moves.NUM_LC0_MOVES), np.float32), np.zeros((0, 3), np.float32)
        return np.concatenate(pols), np.concatenate(wdls)


def _bucket(n: int, cap: int) -> int:
    size = 8
    while size < n:
        size *= 2
    return min(size, cap) if n <= cap else n


# --- the nine networks: Maia* -------------------------------------------------------------------

_NAME = re.compile(r"maia-(\d{4})\.pb(\.gz)?$")


def find_maia_files(directory: str | os.PathLike) -> dict[int, epath.Path]:
    """``{rating: path}`` of the ``maia-XXXX.pb.gz`` files in ``directory``."""
    directory = epath.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"--maia_dir {directory}: not a directory")
    found = {}
    for p in directory.iterdir():
        m = _NAME.search(p.name)
        if m:
            found[int(m.group(1))] = p
    if not found:
        raise FileNotFoundError(f"--maia_dir {directory}: no maia-XXXX.pb.gz files")
    return dict(sorted(found.items()))


def nearest_rating(rating: float, available: Sequence[int] = MAIA_ELOS) -> int:
    """The Maia network for a player: nearest rating, clamped to the available range (ties go down)."""
    available = sorted(available)
    return min(available, key=lambda r: (abs(r - rating), r))


class MaiaSet:
    """The Maia networks of a directory, loaded lazily; ``for_rating`` gives Maia*'s choice."""

    def __init__(self, directory: str | os.PathLike, batch_size: int = 256):
        self.files = find_maia_files(directory)
        self.batch_size = batch_size
        self._predictors: dict[int, MaiaPredictor] = {}

    @property
    def ratings(self) -> list[int]:
        return list(self.files)

    def predictor(self, rating: int) -> MaiaPredictor:
        if rating not in self.files:
            raise KeyError(f"no maia-{rating} network (have {self.ratings})")
        if rating not in self._predictors:
            self._predictors[rating] = MaiaPredictor(load_maia(self.files[rating]), self.batch_size)
        return self._predictors[rating]

    def for_rating(self, rating: float) -> tuple[int, MaiaPredictor]:
        chosen = nearest_rating(rating, self.ratings)
        return chosen, self.predictor(chosen)
