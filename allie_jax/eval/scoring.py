"""Model outputs at every position of many games: one causal pass per game (and the per-prefix
reference the released evaluator used, kept for the benchmark and the equivalence test).

A decoder's output at token t depends only on tokens ≤ t, so a single pass over
``[header, m1 .. mN]`` yields the prediction for every position i at index ``header_len − 1 + i``;
re-running the model once per prefix (the released design) computes the same numbers N times
more slowly. Games are batched by length into a few padded shapes (multiples of ``bucket``) so
jit compiles a handful of programs, and the padding never reaches the real tokens: it is causal
and carries segment id 0.
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
    """Log-probabilities, value and think time at every token (one program per model structure
    and shape, shared by every scorer of the process)."""
    m = nnx.merge(graphdef, state)
    out = m(tokens, segment_ids=segment_ids, deterministic=True)
    logp = jax.nn.log_softmax(out.policy_logits.astype(jnp.float32), axis=-1)
    return logp, out.value, denormalize_think_time(out.time)


class CausalScorer:
    """Batched, jit-compiled causal passes of one model; see the module docstring."""

    def __init__(self, model: nnx.Module, *, batch_size: int = 16, bucket: int = 64):
        self.batch_size = batch_size
        self.bucket = bucket
        self.max_len = min(int(model.config.max_len), vocab.MAX_SEQ_LEN)
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

    def score(
        self,
        games: Sequence[Game],
        *,
        elo_override: int | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, PositionOutputs]]:
        """(index into ``games``, outputs) for every game, in batch order (longest games first).

        A batch only holds games of one padded length, so a game's numbers depend on the game
        alone, not on which games share its batch: the same game scores the same bits in any
        chunk or shard (a longer neighbour would pad it further, which moves float rounding).
        """
        encoded = [game_tokens(g, self.max_len, elo_override=elo_override) for g in games]
        order = sorted(range(len(games)), key=lambda i: -len(encoded[i][0]))
        batches: list[list[int]] = []
        for i in order:
            width = self.padded_len(len(encoded[i][0]))
            last = batches[-1] if batches else None
            if (
                last
                and len(last) < self.batch_size
                and self.padded_len(len(encoded[last[0]][0])) == width
            ):
                last.append(i)
            else:
                batches.append([i])
        for idx in batches:
            logp, value, time_s = self.run_rows([encoded[i][0] for i in idx])
            for b, i in enumerate(idx):
                tokens, h = encoded[i]
                rows = slice(h - 1, len(tokens))
                yield i, PositionOutputs(logp[b, rows], value[b, rows], time_s[b, rows])
            if on_batch is not None:
                on_batch(len(idx))


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
