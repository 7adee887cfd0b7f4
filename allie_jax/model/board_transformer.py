"""The board-state transformer with iterative refinement (seed 001), a second model family.

The decoder (``transformer.py``) reads a game's move history; this model reads one position. Its
input is a fixed set of tokens (seed 001, in this order):

    CLS | 64 squares (| 64 colour tokens) | side to move | 4 castling | 9 en passant |
    repetition | half-move clock | full-move number | (2 Elo) | 3 refinement

The seed says "84 tokens in total" but its own list adds up to 85 (1 + 64 + 1 + 4 + 9 + 1 + 1 +
1 + 3); we build every token it lists, so the seed layout here has 85 (87 with our Elo tokens).

- Squares: one of 13 learned state embeddings (empty, 6 White, 6 Black); ``piece_scheme="9_add"``
  adds a type embedding (empty + 6) and a colour embedding (2) instead, and ``"9_tokens"`` puts the
  colour embedding on a second token per square (128 square tokens), the seed's two 9-embedding
  variants. Each square token also gets a learned absolute square embedding, and attention between
  square tokens gets a learned per-head bias indexed by the (file, rank) offset of the two squares
  (a relative position encoding, as Leela's transformers use). The absolute embedding is ours:
  the policy is read from the CLS token, which has no other way to tell where a piece stands.
- Binary tokens (side, castling, en passant available, en-passant file one-hot) each have their
  own two-row table. ``flip=True`` is the seed's Scheme 2: the board is mirrored when Black is to
  move, pieces become own / enemy, castling rights own / enemy, and the side token is dropped; the
  policy and the rights head are mapped back to absolute squares, so callers never see the flip.
- Repetition: 4 rows, occurrences 0, 1, 2+ and a 4th "no move" row, the seed's "matrix reuse": the
  same table embeds the repetition count of each refinement candidate, and row 3 fills the
  refinement slots in pass 1.
- Half-move clock: the seed's stated scaling ``(halfmoves / 50) · e`` (the default,
  ``halfmove_degree=1``). Its "polynomial of degree 8" is under-specified; ``halfmove_degree=8``
  gives ``Σ_k x^k · e_k`` with ``x = min(halfmoves, 150) / 150`` (one learned vector per power,
  the variable kept in [0, 1] so the eighth power cannot blow up).
- Full-move: ``((fullmoves / 100) · e16) · M`` with a 16-dim ``e16`` and a ``[16, d]`` matrix.
- Elo (ours, ``use_elo``): two soft tokens by ``transformer.soft_elo`` (the decoder's rule),
  White then Black (mover then opponent when flipped); an unknown rating gets a learned vector.

Heads read the CLS token of pass 1: policy over the 1,968 moves (fc1), the 13 castling /
en-passant rights of the position after the move (fc3, auxiliary), and a tanh value (ours, for
search; predicted for the side to move and returned from White's view like the decoder's).

Iterative refinement (``refinement``): pass 2 replaces the 3 refinement slots with the pass-1
top-3 legal moves, ``uci_embedding + repetition_embedding + prob · scaling_embedding`` plus a rank
embedding (both passes carry the rank), and reads a 3-way choice from the three slots' outputs.
Candidates are always legal moves (the repetition embedding needs a real move), whatever
``mask_illegal`` says about the pass-1 softmax. The final distribution keeps pass 1 outside the
top 3 and splits the top-3 mass by the choice, so its argmax is the chosen move.

``mask_illegal`` sets illegal moves' pass-1 logits to −1e9 before the softmax (the seed's
mask / no-mask ablation). ``feedback_cycles = K`` runs blocks ``feedback_from..feedback_to`` K
more times after the first pass through them (the seed's "later blocks fed back into earlier
ones"); 0 (the default) is a plain stack.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import vocab
from allie_jax.model import attention
from allie_jax.model import sharding as sh
from allie_jax.model.config import NamedConfig
from allie_jax.model.transformer import MLP, Attention, LayerNorm, param, soft_elo

Array = jax.Array
_zeros = jax.nn.initializers.zeros


def _normal(std: float):
    """Normal init; eager construction draws from numpy seeded by the key.

    Eagerly, every distinct parameter shape would otherwise compile its own XLA random program
    (dozens here, seconds each on a loaded CPU); under ``jit`` / ``eval_shape`` (the trainer) the
    key is traced and JAX's initializer is used.
    """
    jax_init = jax.nn.initializers.normal(std)

    def init(key, shape, dtype=jnp.float32):
        if isinstance(key, jax.core.Tracer):
            return jax_init(key, shape, dtype)
        seed = np.asarray(jax.random.key_data(key)).ravel().tolist()
        return jnp.asarray(np.random.default_rng(seed).normal(0.0, std, shape), dtype)

    return init


PIECE_SCHEMES = ("13", "9_add", "9_tokens")
NUM_CANDIDATES = 3
NO_MOVE_REPETITION = 3  # the repetition table's 4th row
MASKED_LOGIT = -1e9
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class BoardConfig(NamedConfig):
    """Hyper-parameters and ablation switches of the board-state transformer (JSON round-trip)."""

    size_kind: ClassVar[str] = "board model"

    family: str = "board"  # marks a board checkpoint's config.json
    num_layers: int = 4
    embed_dim: int = 64
    num_heads: int = 8  # the seed's 8 heads
    mlp_ratio: int = 4  # the seed's MLP ×4
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str | None = None
    remat: bool = False
    piece_scheme: str = "13"  # 13 | 9_add | 9_tokens (128 square tokens)
    flip: bool = False  # colour-relative (Scheme 2) instead of absolute pieces + side token
    mask_illegal: bool = True
    refinement: bool = True
    halfmove_degree: int = 1  # 1: the seed's (h / 50)·e; 8: the polynomial variant
    use_elo: bool = True
    feedback_cycles: int = 0
    feedback_from: int = 0  # first block of the fed-back range (i)
    feedback_to: int = -1  # last block of the range (j); -1 = the last block

    def __post_init__(self) -> None:
        if self.family != "board":
            raise ValueError(f"BoardConfig.family must be 'board', got {self.family!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}"
            )
        if self.piece_scheme not in PIECE_SCHEMES:
            raise ValueError(f"piece_scheme={self.piece_scheme!r}: expected one of {PIECE_SCHEMES}")
        if self.halfmove_degree not in (1, 8):
            raise ValueError(f"halfmove_degree={self.halfmove_degree}: expected 1 or 8")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(f"{field}={getattr(self, field)!r}: expected {list(_DTYPES)}")
        lo, hi = self.feedback_from, self.feedback_block_end
        if self.feedback_cycles < 0 or not 0 <= lo <= hi < self.num_layers:
            raise ValueError(
                f"feedback blocks {self.feedback_from}..{self.feedback_to} (cycles "
                f"{self.feedback_cycles}) do not fit {self.num_layers} layers"
            )

    # The names the decoder's LayerNorm / Attention / MLP read, so those modules are reused as-is.
    def resolved_attention_impl(self, backend: str) -> str:
        """The kernel the (bias-carrying) board attention runs: XLA unless cuDNN is asked for."""
        del backend
        return "cudnn" if self.attention_impl == "cudnn" else "xla"

    @property
    def attention_dropout(self) -> float:
        """No dropout on attention probabilities (the decoder's GPT-2 ``attn_pdrop``)."""
        return 0.0

    @property
    def max_segments_per_row(self) -> int:
        """Rows are never packed (one position each); the game-attention kernel's default."""
        return attention.DEFAULT_MAX_SEGMENTS

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def hidden_dim(self) -> int:
        return self.mlp_ratio * self.embed_dim

    @property
    def compute_dtype(self) -> Any:
        return _DTYPES[self.dtype]

    @property
    def parameter_dtype(self) -> Any:
        return _DTYPES[self.param_dtype]

    @property
    def feedback_block_end(self) -> int:
        return self.feedback_to if self.feedback_to >= 0 else self.num_layers - 1

    @property
    def num_square_tokens(self) -> int:
        return 128 if self.piece_scheme == "9_tokens" else 64

    @property
    def num_tokens(self) -> int:
        """85 in the seed's layout (13 embeddings, no flip, no Elo); see the module docstring."""
        return (
            1
            + self.num_square_tokens
            + (0 if self.flip else 1)
            + 4
            + 9
            + 3
            + (2 if self.use_elo else 0)
            + NUM_CANDIDATES
        )


NAMED_SIZES: dict[str, dict[str, Any]] = {
    "board_tiny": dict(num_layers=4, embed_dim=64, num_heads=8),
    # DeepMind's largest searchless model had 270M parameters; this depth and width land there.
    "board_270m": dict(num_layers=21, embed_dim=1024, num_heads=8),
}
BoardConfig.named_sizes = NAMED_SIZES


@flax.struct.dataclass
class BoardOutputs:
    """Per-position predictions; every move index is in the absolute 1,968-move vocabulary."""

    policy_logits: Array  # float32 [B, 1968], pass 1 (masked to −1e9 when mask_illegal)
    final_log_probs: Array  # float32 [B, 1968], after refinement (= log_softmax(pass 1) without)
    rights_logits: Array  # float32 [B, 13], rights after the move (sigmoid logits)
    value: Array  # float32 [B], tanh, White's view
    candidates: Array  # int32 [B, 3], pass-1 top-3 legal moves (−1 where fewer legal moves)
    choice_logits: Array  # float32 [B, 3], pass 2 (zeros when refinement is off / skipped)


# --------------------------------------------------------------------------- static tables
@functools.cache
def mirror_moves() -> np.ndarray:
    """int32 [1968]: the id of each move mirrored top-to-bottom (rank r -> 9 − r); an involution."""
    out = np.zeros(vocab.NUM_MOVES, np.int32)
    for i, m in enumerate(vocab.MOVES):
        mirrored = m[0] + str(9 - int(m[1])) + m[2] + str(9 - int(m[3])) + m[4:]
        out[i] = vocab.MOVE_TO_ID[mirrored]
    return out


@functools.cache
def relative_offsets() -> np.ndarray:
    """int32 [64, 64]: index of (Δfile, Δrank) in a 15 × 15 table for each square pair."""
    sq = np.arange(64)
    f, r = sq % 8, sq // 8
    return ((f[:, None] - f[None, :] + 7) * 15 + (r[:, None] - r[None, :] + 7)).astype(np.int32)


def flip_inputs(batch: dict[str, Array]) -> dict[str, Array]:
    """Colour-relative inputs: rows with Black to move are mirrored and their colours swapped.

    After this every row reads "side to move at the bottom, own pieces 1..6, own castling first".
    """
    black = batch["side"].astype(jnp.int32) == 0  # [B]
    squares = batch["squares"].astype(jnp.int32)
    mirrored = squares[:, np.arange(64) ^ 56]
    swapped = jnp.where(mirrored == 0, 0, jnp.where(mirrored <= 6, mirrored + 6, mirrored - 6))
    castling = batch["castling"].astype(jnp.int32)
    out = dict(batch)
    out["squares"] = jnp.where(black[:, None], swapped, squares)
    out["castling"] = jnp.where(black[:, None], castling[:, jnp.array([2, 3, 0, 1])], castling)
    out["move_info"] = jnp.where(
        black[:, None], batch["move_info"][:, mirror_moves()], batch["move_info"]
    )
    out["white_elo"] = jnp.where(black, batch["black_elo"], batch["white_elo"])  # mover
    out["black_elo"] = jnp.where(black, batch["white_elo"], batch["black_elo"])  # opponent
    return out


def _unflip_moves(x: Array, black: Array) -> Array:
    """Map per-move values ``[B, 1968]`` from the flipped frame back to absolute move ids."""
    return jnp.where(black[:, None], x[:, mirror_moves()], x)


def _unflip_rights(x: Array, black: Array) -> Array:
    swapped = x[:, jnp.array([2, 3, 0, 1] + list(range(4, 13)))]
    return jnp.where(black[:, None], swapped, x)


# --------------------------------------------------------------------------- modules
class BoardBlock(nnx.Module):
    """Pre-LN block (the decoder's LayerNorm / Attention projections / MLP) with a bias term."""

    def __init__(self, cfg: BoardConfig, rngs: nnx.Rngs):
        self.ln_1 = LayerNorm(cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.ln_2 = LayerNorm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.dtype = cfg.compute_dtype

    def __call__(
        self, x: Array, bias: Array, deterministic: bool, rows: slice | None = None
    ) -> Array:
        """``rows``: only these tokens' outputs (queries), every token still a key and value;
        the last block of a pass computes just what the heads read."""
        if self.attn.impl == "cudnn":
            q, k, v = self.attn.project(self.ln_1(x))
            if rows is not None:
                q, x, bias = q[:, rows], x[:, rows], bias[:, :, rows]
            dt = self.dtype
            out = jax.nn.dot_product_attention(
                q, k, v, bias=bias.astype(dt), implementation=self.attn.impl
            )
            out = self.attn.output(out)
        else:
            out = self._attend_heads_major(self.ln_1(x), bias, rows)
            if rows is not None:
                x = x[:, rows]
        x = x + self.dropout(out, deterministic=deterministic)
        x = x + self.dropout(self._mlp(self.ln_2(x)), deterministic=deterministic)
        return sh.constrain(x, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))

    def _mlp(self, x: Array) -> Array:
        """The decoder's MLP (its parameters) with ``gelu_tanh`` for the activation."""
        mlp, dt = self.mlp, self.dtype
        h = x @ mlp.fc[...].astype(dt) + mlp.fc_bias[...].astype(dt)
        h = sh.constrain(gelu_tanh(h), (sh.BATCH, sh.LENGTH, sh.MLP))
        return h @ mlp.proj[...].astype(dt) + mlp.proj_bias[...].astype(dt)

    def _attend_heads_major(self, x: Array, bias: Array, rows: slice | None) -> Array:
        """The XLA attention of ``jax.nn.dot_product_attention`` with the heads ahead of the
        tokens (``[B, heads, T, head_dim]``) from the projection on.

        With head_dim 8 and ~90 tokens the forward is many tiny batched matmuls and elementwise
        passes over the ``[B, heads, T, S]`` scores; XLA on CPU runs ``dot_product_attention``'s
        ``BTNH`` layout with a transposed copy of every probability matrix. Here the projections
        write heads-major and the scores stay ``[B, heads, T, S]``; the exponential is
        ``exp_nonpositive``; the weights are normalised after the product with ``v`` (a divide
        per ``head_dim`` entry instead of per key). The same function as
        ``dot_product_attention``: ``softmax(q·k / sqrt(head_dim) + bias) · v``, scores in
        float32; the results differ by float32 rounding.
        """
        attn, dt = self.attn, self.dtype

        def proj(w: nnx.Param, b: nnx.Param, xs: Array) -> Array:
            y = jnp.einsum("btd,dnh->bnth", xs, w[...].astype(dt))
            return y + b[...].astype(dt)[None, :, None, :]

        q = proj(attn.query, attn.query_bias, x if rows is None else x[:, rows])
        k = proj(attn.key, attn.key_bias, x)
        v = proj(attn.value, attn.value_bias, x)
        if rows is not None:
            bias = bias[:, :, rows]
        scale = 1.0 / math.sqrt(q.shape[-1])
        logits = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=jnp.float32)
        logits = logits * jnp.float32(scale) + bias.astype(jnp.float32)
        # softmax(logits) · v, normalised after the product: [.., head_dim] divides, not [.., S].
        weights = exp_nonpositive(logits - jnp.max(logits, axis=-1, keepdims=True))
        total = jnp.sum(weights, axis=-1, keepdims=True)
        out = jnp.einsum("bnts,bnsh->bnth", weights.astype(dt), v) / total.astype(dt)
        y = jnp.einsum("bnth,nhd->btd", out, attn.out[...].astype(dt))
        return y + attn.out_bias[...].astype(dt)


def exp_nonpositive(x: Array) -> Array:
    """``exp(x)`` for float32 ``x <= 0`` (softmax after its max is subtracted), as a polynomial.

    XLA's CPU ``exp`` is several times slower than this vectorised polynomial, and the board
    model's attention takes one per score. Cephes ``expf``: ``x = n·ln2 + r`` with
    ``|r| <= ln2/2``, ``exp(r)`` by its degree-6 minimax polynomial, times ``2^n`` built in the
    exponent bits; within about an ulp of ``exp``. Inputs below −87 give 0 (``exp(−87)``
    is 1.6e-38, at float32's smallest normal).
    """
    x = x.astype(jnp.float32)
    # the polynomial reads x clamped, so below −87 (a masked score, −inf) neither its value nor
    # its gradient is inf/NaN: ``where`` passes the unselected branch's gradient times 0
    xc = jnp.maximum(x, -87.0)
    n = jnp.round(xc * np.float32(1.44269504088896341))
    r = xc - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = jnp.float32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + np.float32(c)
    p = (p * r * r + r) + np.float32(1.0)
    scale = jax.lax.bitcast_convert_type((n.astype(jnp.int32) + 127) << 23, jnp.float32)
    return jnp.where(x < -87.0, 0.0, p * scale)


def gelu_tanh(x: Array) -> Array:
    """``jax.nn.gelu(x, approximate=True)``, written ``x · sigmoid(2u)`` (the same function:
    ``(1 + tanh u) / 2 = sigmoid(2u)``) with ``exp_nonpositive`` on ``−2|u|``, because XLA's CPU
    ``tanh`` is as slow as its ``exp``."""
    xf = x.astype(jnp.float32)
    u = np.float32(math.sqrt(2.0 / math.pi)) * (xf + np.float32(0.044715) * xf * xf * xf)
    e = exp_nonpositive(-2.0 * jnp.abs(u))  # exp(−2|u|) in (0, 1]
    sig = jnp.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (xf * sig).astype(x.dtype)


def _table(rngs: nnx.Rngs, rows: int, cfg: BoardConfig, std: float = 0.02) -> nnx.Param:
    return param(rngs, _normal(std), (rows, cfg.embed_dim), (None, sh.EMBED), cfg.parameter_dtype)


class BoardTransformer(nnx.Module):
    """Seed 001's encoder over one position, with two-pass top-3 refinement."""

    def __init__(self, config: BoardConfig, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        cfg = self.config = config
        d, pd = cfg.embed_dim, cfg.parameter_dtype
        self.cls = _table(rngs, 1, cfg)
        if cfg.piece_scheme == "13":
            self.square_state = _table(rngs, 13, cfg)
        else:
            self.piece_type = _table(rngs, 7, cfg)  # empty + 6 types
            self.piece_colour = _table(rngs, 2, cfg)  # White / Black (own / enemy when flipped)
        self.square_pos = _table(rngs, 64, cfg)
        self.relative_bias = param(
            rngs, _zeros, (cfg.num_heads, 15 * 15), (sh.HEADS, None), jnp.float32
        )
        if not cfg.flip:
            self.side = _table(rngs, 2, cfg)
        self.castling = param(rngs, _normal(0.02), (4, 2, d), (None, None, sh.EMBED), pd)
        self.ep_available = _table(rngs, 2, cfg)
        self.ep_file = param(rngs, _normal(0.02), (8, 2, d), (None, None, sh.EMBED), pd)
        self.repetition = _table(rngs, 4, cfg)
        self.halfmove = _table(rngs, cfg.halfmove_degree, cfg)
        self.fullmove = param(rngs, _normal(0.02), (16,), (None,), pd)
        self.fullmove_matrix = param(rngs, _normal(0.25), (16, d), (None, sh.EMBED), pd)
        if cfg.use_elo:
            self.elo_embed = _table(rngs, 2, cfg)  # rows: strong, weak (transformer.soft_elo)
            self.elo_unknown = _table(rngs, 1, cfg)
            self.elo_role = _table(rngs, 2, cfg)  # White / Black (mover / opponent)
        self.no_move = _table(rngs, 1, cfg)
        self.uci = param(rngs, _normal(0.02), (vocab.NUM_MOVES, d), (sh.VOCAB, sh.EMBED), pd)
        self.prob_scale = _table(rngs, 1, cfg)
        self.rank = _table(rngs, NUM_CANDIDATES, cfg)
        self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.blocks = nnx.List([BoardBlock(cfg, rngs) for _ in range(cfg.num_layers)])
        self.ln_f = LayerNorm(cfg, rngs)
        self.policy_head = param(
            rngs, _normal(0.02), (d, vocab.NUM_MOVES), (sh.EMBED, sh.VOCAB), pd
        )
        self.policy_bias = param(rngs, _zeros, (vocab.NUM_MOVES,), (sh.VOCAB,), pd)
        self.rights_head = param(rngs, _normal(0.02), (d, 13), (sh.EMBED, None), pd)
        self.rights_bias = param(rngs, _zeros, (13,), (None,), pd)
        self.value_head = param(rngs, _normal(0.02), (d, 1), (sh.EMBED, None), pd)
        self.value_bias = param(rngs, _zeros, (1,), (None,), pd)
        self.choice_head = param(rngs, _normal(0.02), (d, 1), (sh.EMBED, None), pd)
        self.choice_bias = param(rngs, _zeros, (1,), (None,), pd)

    # ------------------------------------------------------------------ tokens
    def _squares(self, squares: Array) -> Array:
        """Square tokens ``[B, 64 or 128, d]`` from states 0..12 (already flipped if configured)."""
        pos = self.square_pos[...][None]
        if self.config.piece_scheme == "13":
            return self.square_state[...][squares] + pos
        ptype = jnp.where(squares == 0, 0, (squares - 1) % 6 + 1)
        colour = jnp.where(squares >= 7, 1, 0)
        type_emb = self.piece_type[...][ptype]
        colour_emb = jnp.where((squares == 0)[..., None], 0.0, self.piece_colour[...][colour])
        if self.config.piece_scheme == "9_add":
            return type_emb + colour_emb + pos
        # 9_tokens: a colour token per square; an empty square's is the empty-type embedding.
        colour_tok = jnp.where((squares == 0)[..., None], self.piece_type[...][0], colour_emb)
        return jnp.concatenate([type_emb + pos, colour_tok + pos], axis=1)

    def _halfmove(self, halfmoves: Array) -> Array:
        h = halfmoves.astype(jnp.float32)
        table = self.halfmove[...]
        if self.config.halfmove_degree == 1:
            return (h / 50.0)[:, None] * table[0]
        x = jnp.minimum(h, 150.0) / 150.0
        powers = x[:, None] ** jnp.arange(1, self.config.halfmove_degree + 1, dtype=jnp.float32)
        return powers @ table

    def _elo_tokens(self, white_elo: Array, black_elo: Array) -> Array:
        out = []
        for i, elo in enumerate((white_elo, black_elo)):
            elo = elo.astype(jnp.float32)
            e = soft_elo(elo, self.elo_embed[...])
            e = jnp.where((elo > 0)[:, None], e, self.elo_unknown[...][0])
            out.append(e + self.elo_role[...][i])
        return jnp.stack(out, axis=1)

    def context_tokens(self, inputs: dict[str, Array]) -> Array:
        """Every token but the 3 refinement slots: ``[B, num_tokens − 3, d]`` (float32)."""
        cfg = self.config
        b = inputs["squares"].shape[0]
        i32 = lambda k: inputs[k].astype(jnp.int32)  # noqa: E731
        parts = [jnp.broadcast_to(self.cls[...][None], (b, 1, cfg.embed_dim))]
        parts.append(self._squares(i32("squares")))
        if not cfg.flip:
            parts.append(self.side[...][i32("side")][:, None])
        castling = i32("castling")
        parts.append(self.castling[...][jnp.arange(4)[None], castling])
        ep = i32("ep_file")
        parts.append(self.ep_available[...][(ep >= 0).astype(jnp.int32)][:, None])
        onehot = (ep[:, None] == jnp.arange(8)[None]).astype(jnp.int32)
        parts.append(self.ep_file[...][jnp.arange(8)[None], onehot])
        parts.append(self.repetition[...][jnp.clip(i32("repetition"), 0, 2)][:, None])
        parts.append(self._halfmove(inputs["halfmoves"])[:, None])
        full = inputs["fullmoves"].astype(jnp.float32) / 100.0
        parts.append(
            ((full[:, None] * self.fullmove[...][None]) @ self.fullmove_matrix[...])[:, None]
        )
        if cfg.use_elo:
            parts.append(self._elo_tokens(inputs["white_elo"], inputs["black_elo"]))
        return jnp.concatenate([p.astype(jnp.float32) for p in parts], axis=1)

    def empty_slots(self, batch_size: int) -> Array:
        """Pass-1 refinement slots: no-move + 'no move' repetition row + rank."""
        slot = self.no_move[...][0] + self.repetition[...][NO_MOVE_REPETITION]
        return jnp.broadcast_to(
            slot + self.rank[...], (batch_size, NUM_CANDIDATES, self.config.embed_dim)
        )

    def candidate_slots(self, moves: Array, repetition: Array, probs: Array) -> Array:
        """Pass-2 slots: ``uci + repetition + prob · scaling + rank``; moves in the model's frame."""
        emb = self.uci[...][jnp.clip(moves, 0, vocab.NUM_MOVES - 1)]
        rep = self.repetition[...][
            jnp.where(moves >= 0, jnp.clip(repetition, 0, 2), NO_MOVE_REPETITION)
        ]
        slot = emb + rep + probs[..., None] * self.prob_scale[...][0] + self.rank[...][None]
        return jnp.where((moves >= 0)[..., None], slot, self.empty_slots(moves.shape[0]))

    # ------------------------------------------------------------------ trunk
    def attention_bias(self) -> Array:
        """``[1, heads, T, T]``: the relative (file, rank) bias between square tokens, 0 elsewhere."""
        cfg = self.config
        rel = self.relative_bias[...][:, relative_offsets()]  # [H, 64, 64]
        n_sq = cfg.num_square_tokens
        if n_sq == 128:
            rel = jnp.tile(rel, (1, 2, 2))
        t = cfg.num_tokens
        bias = jnp.zeros((cfg.num_heads, t, t), jnp.float32)
        bias = bias.at[:, 1 : 1 + n_sq, 1 : 1 + n_sq].set(rel)
        return bias[None]

    def block_order(self) -> list[int]:
        """The blocks in the order they run: ``0..j``, then ``i..j`` per feedback cycle, the rest."""
        cfg = self.config
        lo, hi = cfg.feedback_from, cfg.feedback_block_end
        order = list(range(hi + 1))
        for _ in range(cfg.feedback_cycles):
            order += list(range(lo, hi + 1))
        return order + list(range(hi + 1, cfg.num_layers))

    def encode(
        self,
        tokens: Array,
        deterministic: bool = True,
        *,
        patch: tuple[int, Array, Array] | None = None,
        capture: list | None = None,
        rows: slice | None = None,
    ) -> Array:
        """The block stack (with optional feedback cycles) and the final LayerNorm.

        The residual stream at step ``s`` is the input of the ``s``-th block run (step 0: the
        embeddings; step ``len(block_order())``: the last block's output). ``patch = (s, mask
        [T] or [B, T] bool, values [B, T, d])`` replaces the masked tokens' residual at step ``s``
        (activation patching); ``capture`` collects every step's residual. ``rows``: return only
        these tokens (the last block then runs their queries alone, unless the last step's
        residual is captured or patched).
        """
        cfg = self.config
        x = self.embed_dropout(tokens, deterministic=deterministic).astype(cfg.compute_dtype)
        x = sh.constrain(x, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))
        bias = self.attention_bias()

        def run(block: BoardBlock, x: Array) -> Array:
            return block(x, bias, deterministic)

        def run_rows(block: BoardBlock, x: Array) -> Array:
            return block(x, bias, deterministic, rows)

        if cfg.remat:
            run, run_rows = nnx.remat(run), nnx.remat(run_rows)
        order = self.block_order()
        prune = rows is not None and capture is None and (patch is None or patch[0] < len(order))

        def at_step(step: int, x: Array) -> Array:
            if patch is not None and patch[0] == step:
                mask = jnp.asarray(patch[1], bool)
                mask = mask[None, :, None] if mask.ndim == 1 else mask[..., None]
                x = jnp.where(mask, jnp.asarray(patch[2], x.dtype), x)
            if capture is not None:
                capture.append(x)
            return x

        for step, i in enumerate(order):
            last = prune and step == len(order) - 1
            x = (run_rows if last else run)(self.blocks[i], at_step(step, x))
        if prune:
            return self.ln_f(x).astype(jnp.float32)
        x = at_step(len(order), x)
        x = self.ln_f(x).astype(jnp.float32)
        return x if rows is None else x[:, rows]

    # ------------------------------------------------------------------ forward
    def __call__(
        self,
        inputs: dict[str, Array],
        *,
        deterministic: bool = True,
        refine: bool | None = None,
        patch: tuple[int, Array, Array] | None = None,
        capture: list | None = None,
    ) -> BoardOutputs:
        """Both passes. ``inputs`` holds the data pipeline's ``INPUT_FIELDS`` (batched);
        ``refine=False`` skips pass 2 (e.g. a search that only needs the prior and the value);
        ``patch`` / ``capture`` act on pass 1 (see ``encode``)."""
        cfg = self.config
        refine = cfg.refinement if refine is None else (refine and cfg.refinement)
        black = inputs["side"].astype(jnp.int32) == 0
        frame = flip_inputs(inputs) if cfg.flip else inputs
        legal_info = frame["move_info"].astype(jnp.int32)  # −1 illegal, else repetition count
        legal = legal_info >= 0
        context = self.context_tokens(frame)
        b = context.shape[0]
        h1 = self.encode(
            jnp.concatenate([context, self.empty_slots(b)], axis=1),
            deterministic,
            patch=patch,
            capture=capture,
            rows=slice(0, 1),  # the heads read the CLS token only
        )
        cls = h1[:, 0]
        logits = cls @ self.policy_head[...] + self.policy_bias[...]
        logits = sh.constrain(logits, (sh.BATCH, sh.VOCAB))
        if cfg.mask_illegal:
            logits = jnp.where(legal, logits, MASKED_LOGIT)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        rights = cls @ self.rights_head[...] + self.rights_bias[...]
        value_mover = jnp.tanh(cls @ self.value_head[...] + self.value_bias[...])[:, 0]

        legal_scores = jnp.where(legal, logits, -jnp.inf)
        top_scores, top = jax.lax.top_k(legal_scores, NUM_CANDIDATES)
        top = jnp.where(jnp.isfinite(top_scores), top, -1).astype(jnp.int32)
        choice = jnp.zeros((b, NUM_CANDIDATES), jnp.float32)
        final = log_probs
        if refine:
            safe = jnp.clip(top, 0, vocab.NUM_MOVES - 1)
            probs = jnp.where(top >= 0, jnp.exp(jnp.take_along_axis(log_probs, safe, 1)), 0.0)
            reps = jnp.take_along_axis(legal_info, safe, 1)
            slots = self.candidate_slots(top, reps, probs)
            h2 = self.encode(
                jnp.concatenate([context, slots], axis=1),
                deterministic,
                rows=slice(-NUM_CANDIDATES, None),  # the choice reads the 3 slots only
            )
            choice = (h2 @ self.choice_head[...] + self.choice_bias[...])[..., 0]
            choice = jnp.where(top >= 0, choice, MASKED_LOGIT)
            final = refined_log_probs(log_probs, top, choice)
        if cfg.flip:
            logits = _unflip_moves(logits, black)
            final = _unflip_moves(final, black)
            rights = _unflip_rights(rights, black)
            mirrored = jnp.asarray(mirror_moves())[jnp.clip(top, 0)]
            top = jnp.where(black[:, None] & (top >= 0), mirrored, top)
        value_white = jnp.where(black, -value_mover, value_mover)
        return BoardOutputs(
            policy_logits=logits.astype(jnp.float32),
            final_log_probs=final.astype(jnp.float32),
            rights_logits=rights.astype(jnp.float32),
            value=value_white.astype(jnp.float32),
            candidates=top,
            choice_logits=choice.astype(jnp.float32),
        )


def refined_log_probs(log_probs: Array, top: Array, choice_logits: Array) -> Array:
    """Pass 1 outside the top 3; the top-3 mass split by the pass-2 choice (log space)."""
    safe = jnp.clip(top, 0, log_probs.shape[-1] - 1)
    valid = top >= 0
    top_lp = jnp.where(valid, jnp.take_along_axis(log_probs, safe, 1), -jnp.inf)
    mass = jax.nn.logsumexp(top_lp, axis=-1, keepdims=True)
    choice_lp = jax.nn.log_softmax(jnp.where(valid, choice_logits, -jnp.inf), axis=-1)
    new = jnp.where(valid, mass + choice_lp, -jnp.inf)
    rows = jnp.arange(log_probs.shape[0])[:, None]
    # Invalid slots (fewer than 3 legal moves) write to an out-of-range column: dropped.
    cols = jnp.where(valid, top, log_probs.shape[-1])
    return log_probs.at[rows, cols].set(new, mode="drop")


def count_params(config: BoardConfig) -> int:
    """Parameters, from shapes only."""
    abstract = nnx.eval_shape(lambda: BoardTransformer(config, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    return int(sum(math.prod(x.shape) for x in leaves))
