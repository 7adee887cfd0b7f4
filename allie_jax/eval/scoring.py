"""Model outputs at every position of many games: one causal pass per game (and the per-prefix
reference the released evaluator used, kept for the benchmark and the equivalence test).

A decoder's output at token t depends only on tokens ≤ t, so a single pass over
``[header, m1 .. mN]`` yields the prediction for every position i at index ``header_len − 1 + i``;
re-running the model once per prefix (the released design) computes the same numbers N times
more slowly.

The pass is packed (``CausalScorer.score``): the per-token layers (embedding, projections, MLP,
heads: nearly all the work) run on the games' tokens laid end to end in one flat row of
``tokens_per_call`` tokens, with no padding between games; only attention runs on per-game rows,
each game at offset 0 of a row of 128, 256 or 512 tokens (``row_widths``).
So a game's numbers depend on the game alone, not on which games share its call: a per-token
layer computes each token's row the same way whatever the other rows hold, and a game's attention
row is the same data in any call, its padding masked to exact zeros. The same game scores the
same bits in any chunk or shard (tests/test_scoring.py checks it against one-game calls and
the padded one-row-per-game pass, on the CPU backend; on GPU/TPU, whose kernels may change with
the call's shape, this has not been checked). A few call shapes (one per row width) means few
compilations.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import vocab
from allie_jax.game import Game, denormalize_think_time, encode_game
from allie_jax.model import attention


@dataclasses.dataclass
class PositionOutputs:
    """Model outputs at positions 0..K−1 of one game (K ≤ N + 1: long games are cut at max_len)."""

    log_probs: np.ndarray  # float32 [K, 1997] log-softmax over the whole vocabulary
    value_white: np.ndarray  # float32 [K] tanh value, White's view
    time_s: np.ndarray  # float32 [K] predicted think time, seconds (denormalised, unclipped)


def game_tokens(
    game: Game, max_len: int, *, elo_override: int | None = None
) -> tuple[np.ndarray, int]:
    """Tokens of the partial game (no termination, no EOS) cut at ``max_len``, and the header length.

    ``elo_override`` conditions both sides on one rating (the greedy preset plays at 2500).
    """
    if elo_override is not None:
        game = dataclasses.replace(game, white_elo=elo_override, black_elo=elo_override)
    enc = encode_game(game, partial=True, max_len=max_len)
    return enc.tokens, enc.header_len


def num_positions(num_tokens: int, header_len: int) -> int:
    """Positions whose prediction lies inside ``num_tokens`` tokens (the final board included)."""
    return num_tokens - header_len + 1


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, segment_ids):
    """Log-probabilities, value and think time at every token of padded rows (the per-prefix
    reference's pass; one program per model structure and shape, shared by every scorer)."""
    m = nnx.merge(graphdef, state)
    out = m(tokens, segment_ids=segment_ids, deterministic=True)
    logp = jax.nn.log_softmax(out.policy_logits.astype(jnp.float32), axis=-1)
    return logp, out.value, denormalize_think_time(out.time)


def row_widths(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """Attention row widths of the packed pass: ``smallest · 2^k`` below ``max_len``, then
    ``max_len`` rounded up to a multiple of 64.

    On XLA's CPU backend a game at offset 0 of a row gives the same bits for any row width that is
    a multiple of 64 (the padding only adds exact zeros to its sums; widths like 96 or 160 do not:
    the softmax sums in 64-wide pieces), which tests/test_scoring.py checks against the padded
    pass. Powers of two keep the number of shapes, hence of compilations, small.
    """
    widths = []
    w = smallest
    while w < max_len:
        widths.append(w)
        w *= 2
    return (*widths, -(-max_len // 64) * 64)


@dataclasses.dataclass(frozen=True)
class PackedCall:
    """One device call of the packed pass: ``games`` (indices into the scored list, longest
    first) laid end to end from token 0 of ``tokens``; attention on ``rows`` rows of ``width``."""

    games: tuple[int, ...]
    width: int
    rows: int
    tokens: int


def plan_calls(
    lengths: Sequence[int], tokens_per_call: int, widths: Sequence[int]
) -> list[PackedCall]:
    """Games (by token count) into calls: longest first, each call filled in order until its
    tokens or its attention rows run out. The call's row width fits its first (longest) game;
    its row count ``rows_per_call(width)`` depends on the width alone, so shapes repeat.
    Games that fit one call get a call of their size (rounded up to 128 tokens), not a full one:
    a small evaluation is not mostly padding."""
    if any(n > tokens_per_call or n > widths[-1] for n in lengths):
        raise ValueError(
            f"a game is longer than tokens_per_call={tokens_per_call} or the widest row "
            f"({widths[-1]} tokens)"
        )
    tokens_per_call = min(tokens_per_call, -(-sum(lengths) // 128) * 128)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    calls: list[PackedCall] = []
    current: list[int] = []
    used = width = rows = 0
    for i in order:
        n = lengths[i]
        if current and (used + n > tokens_per_call or len(current) == rows):
            calls.append(PackedCall(tuple(current), width, rows, tokens_per_call))
            current, used = [], 0
        if not current:
            width = next(w for w in widths if w >= n)
            rows = rows_per_call(width, tokens_per_call)
        current.append(i)
        used += n
    if current:
        calls.append(PackedCall(tuple(current), width, rows, tokens_per_call))
    return calls


def rows_per_call(width: int, tokens_per_call: int) -> int:
    """Attention rows of a call: enough for games averaging a quarter of the row width, so the
    attention work (rows · width² ≤ 4 · tokens · width) stays a small part of the call."""
    return max(1, 4 * tokens_per_call // width)


@functools.partial(jax.jit, static_argnums=0)
def _packed_forward(graphdef, state, tokens, positions, rows, row_segments, back):
    """The packed pass: per-token layers (the output projection included) on ``tokens`` [N]
    (games end to end), only the attention kernel on ``rows`` [G, L] (each entry a token index,
    N = padding) with ``row_segments`` (1 real, 0 padding); ``back`` [N] is each token's place
    in the rows. Returns per-token log-probabilities, value and think time."""
    m = nnx.merge(graphdef, state)
    g, width = rows.shape
    x = m.embed(tokens[None], positions[None], deterministic=True)

    def to_rows(a):  # [1, N, H, D] -> [G, L, H, D], padding slots zero
        a = jnp.concatenate([a[0], jnp.zeros((1, *a.shape[2:]), a.dtype)])
        return a[rows]

    for block in m.layer_blocks():
        impl = block.attn.games_impl
        impl = block.attn.resolved_impl() if impl == "auto" else impl
        q, k, v = block.attention_inputs(x)
        o = attention.game_attention(impl, to_rows(q), to_rows(k), to_rows(v), row_segments)
        o = o.reshape(g * width, *o.shape[2:])[back][None]  # back to the packed tokens
        x = block.after_attention(x, block.attn.output(o), deterministic=True)
    out = m.heads(x)
    logp = jax.nn.log_softmax(out.policy_logits[0].astype(jnp.float32), axis=-1)
    return logp, out.value[0], denormalize_think_time(out.time[0])


class CausalScorer:
    """Batched, jit-compiled causal passes of one model; see the module docstring.

    ``score`` is the packed pass (``tokens_per_call`` tokens per device call, default
    ``max(batch_size · bucket, max_len)``); ``run_rows`` is the padded one (``batch_size`` rows
    of a ``bucket``-multiple length), kept for the per-prefix reference.
    """

    def __init__(
        self,
        model: nnx.Module,
        *,
        batch_size: int = 16,
        bucket: int = 64,
        tokens_per_call: int | None = None,
    ):
        self.batch_size = batch_size
        self.bucket = bucket
        self.max_len = min(int(model.config.max_len), vocab.MAX_SEQ_LEN)
        self.tokens_per_call = max(tokens_per_call or batch_size * bucket, self.max_len)
        self.widths = row_widths(self.max_len)
        self._graphdef, self._state = nnx.split(model)

    def padded_len(self, n: int) -> int:
        return min(self.max_len, -(-n // self.bucket) * self.bucket)

    def run_rows(self, rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One forward over up to ``batch_size`` token rows, padded to a bucketed length."""
        if not rows or len(rows) > self.batch_size:
            raise ValueError(f"run_rows takes 1..{self.batch_size} rows, got {len(rows)}")
        length = self.padded_len(max(len(r) for r in rows))
        tokens = np.full((self.batch_size, length), vocab.PAD, dtype=np.int32)
        segments = np.zeros((self.batch_size, length), dtype=np.int32)
        for b, r in enumerate(rows):
            tokens[b, : len(r)] = r
            segments[b, : len(r)] = 1
        logp, value, time_s = _forward(
            self._graphdef, self._state, jnp.asarray(tokens), jnp.asarray(segments)
        )
        return np.asarray(logp), np.asarray(value), np.asarray(time_s)

    def pack(
        self, call: PackedCall, rows: Sequence[np.ndarray]
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """The host arrays of one call (``_packed_forward``'s inputs) and each game's first token."""
        n_tok = call.tokens
        tokens = np.full(n_tok, vocab.PAD, np.int32)
        positions = np.zeros(n_tok, np.int32)
        index = np.full((call.rows, call.width), n_tok, np.int32)
        segments = np.zeros((call.rows, call.width), np.int32)
        back = np.zeros(n_tok, np.int32)
        starts = np.zeros(len(rows), np.int64)
        start = 0
        for r, t in enumerate(rows):
            n = len(t)
            span = np.arange(n, dtype=np.int32)
            tokens[start : start + n] = t
            positions[start : start + n] = span
            index[r, :n] = start + span
            segments[r, :n] = 1
            back[start : start + n] = r * call.width + span
            starts[r] = start
            start += n
        return (tokens, positions, index, segments, back), starts

    def score(
        self,
        games: Sequence[Game],
        *,
        elo_override: int | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, PositionOutputs]]:
        """(index into ``games``, outputs) for every game, in call order (longest games first).

        The next call is dispatched before this one's outputs are handed out, so the caller's
        host work on them overlaps the device's work on the next.
        """
        encoded = [game_tokens(g, self.max_len, elo_override=elo_override) for g in games]
        calls = plan_calls([len(t) for t, _ in encoded], self.tokens_per_call, self.widths)
        pending = None
        for call in calls:
            arrays, starts = self.pack(call, [encoded[i][0] for i in call.games])
            result = _packed_forward(self._graphdef, self._state, *map(jnp.asarray, arrays))
            if pending is not None:
                yield from self._unpack(*pending, encoded, on_batch)
            pending = (call, starts, result)
        if pending is not None:
            yield from self._unpack(*pending, encoded, on_batch)

    @staticmethod
    def _unpack(call, starts, result, encoded, on_batch):
        logp, value, time_s = (np.asarray(x) for x in result)
        for i, start in zip(call.games, starts, strict=True):
            tokens, h = encoded[i]
            rows = slice(start + h - 1, start + len(tokens))
            yield i, PositionOutputs(logp[rows], value[rows], time_s[rows])
        if on_batch is not None:
            on_batch(len(call.games))


def score_per_prefix(
    scorer: CausalScorer, games: Sequence[Game], *, elo_override: int | None = None
) -> Iterator[tuple[int, PositionOutputs]]:
    """The released evaluator's design: one model pass per prefix (batched over prefixes).

    Position i is scored by running ``tokens[: header_len + i]`` and reading the last output.
    Same numbers as ``CausalScorer.score`` (up to float rounding), N times the work.
    """
    for i, game in enumerate(games):
        tokens, h = game_tokens(game, scorer.max_len, elo_override=elo_override)
        k = num_positions(len(tokens), h)
        prefixes = [tokens[: h + j] for j in range(k)]
        logps, values, times = [], [], []
        for start in range(0, k, scorer.batch_size):
            chunk = prefixes[start : start + scorer.batch_size]
            logp, value, time_s = scorer.run_rows(chunk)
            last = np.array([len(p) - 1 for p in chunk])
            rows = np.arange(len(chunk))
            logps.append(logp[rows, last])
            values.append(value[rows, last])
            times.append(time_s[rows, last])
        yield (
            i,
            PositionOutputs(np.concatenate(logps), np.concatenate(values), np.concatenate(times)),
        )
