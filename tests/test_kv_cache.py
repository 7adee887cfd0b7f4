"""The KV cache and search paths reproduce the whole-game pass at every position of real games."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from allie_jax import game as game_lib
from allie_jax.model import AllieModel, ModelConfig
from tests.test_model import load_sample_games, pad_rows

ATOL = 1e-5
CHUNK = 4


@pytest.fixture(scope="module")
def setup(sample_pgn):
    model = AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(7))
    games = load_sample_games(sample_pgn, 3)
    seqs = [game_lib.encode_game(g).tokens for g in games]
    tokens = pad_rows(seqs)
    full = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens))
    return model, seqs, tokens, full


_extend = nnx.jit(lambda m, t, c, n: m.extend(t, c, n))
_path = nnx.jit(lambda m, t, c, pk, pv, pl: m.extend_with_path(t, c, pk, pv, pl))


def _close(out, full, row, cols, out_cols):
    for name in ("policy_logits", "time", "value"):
        np.testing.assert_allclose(
            np.asarray(getattr(out, name))[row, out_cols],
            np.asarray(getattr(full, name))[row, cols],
            atol=ATOL,
            err_msg=f"{name} row {row} positions {cols}",
        )


def test_cached_extension_equals_full_pass_at_every_position(setup):
    """Rows advance by different amounts each step (1..CHUNK tokens), batched, as in search."""
    model, seqs, tokens, full = setup
    b = len(seqs)
    lengths = np.array([len(s) for s in seqs])
    cache = model.init_cache(b, max_len=tokens.shape[1] + CHUNK)
    done = np.zeros(b, int)
    rng = np.random.default_rng(0)
    step = 0
    while (done < lengths).any():
        n = np.minimum(rng.integers(1, CHUNK + 1, size=b), lengths - done)
        if step == 0:
            n = np.minimum(3, lengths)  # the header first
        chunk = np.zeros((b, CHUNK), np.int32)
        for r in range(b):
            chunk[r, : n[r]] = seqs[r][done[r] : done[r] + n[r]]
        out, cache = _extend(model, jnp.asarray(chunk), cache, jnp.asarray(n, jnp.int32))
        for r in range(b):
            if n[r]:
                _close(out, full, r, np.arange(done[r], done[r] + n[r]), np.arange(n[r]))
        done += n
        step += 1
    np.testing.assert_array_equal(cache.length, lengths)


def test_extend_with_path_equals_full_pass_and_leaves_root_alone(setup):
    """Root = a prefix of each game; the path then grows one token per simulation step."""
    model, seqs, tokens, full = setup
    b = len(seqs)
    prefix = np.array([20, 31, 9])
    root = model.init_cache(b, max_len=64)
    root_tokens = pad_rows([s[:p] for s, p in zip(seqs, prefix, strict=True)], length=40)
    _, root = _extend(model, jnp.asarray(root_tokens), root, jnp.asarray(prefix, jnp.int32))
    root_k = np.asarray(root.k).copy()

    depth = 6
    cfg = model.config
    path_k = jnp.zeros((cfg.num_layers, b, depth, cfg.num_heads, cfg.head_dim))
    path_v = jnp.zeros_like(path_k)
    for d in range(depth):
        tok = np.array([[s[p + d]] for s, p in zip(seqs, prefix, strict=True)], np.int32)
        path_len = jnp.full((b,), d, jnp.int32)
        out, nk, nv = _path(model, jnp.asarray(tok), root, path_k, path_v, path_len)
        assert nk.shape == (cfg.num_layers, b, 1, cfg.num_heads, cfg.head_dim)
        for r in range(b):
            _close(out, full, r, np.array([prefix[r] + d]), np.array([0]))
        path_k = path_k.at[:, :, d].set(nk[:, :, 0])
        path_v = path_v.at[:, :, d].set(nv[:, :, 0])

    # Several tokens at once after a path of different lengths per row.
    path_len = jnp.array([2, 5, 0], jnp.int32)
    toks = np.array(
        [s[p + int(pl) : p + int(pl) + 3] for s, p, pl in zip(seqs, prefix, path_len, strict=True)]
    )
    out, nk, _ = _path(model, jnp.asarray(toks, jnp.int32), root, path_k, path_v, path_len)
    for r in range(b):
        start = prefix[r] + int(path_len[r])
        _close(out, full, r, np.arange(start, start + 3), np.arange(3))
    np.testing.assert_array_equal(np.asarray(root.k), root_k)
    np.testing.assert_array_equal(root.length, prefix)


def test_writes_past_the_end_are_dropped(setup):
    model, seqs, _, _ = setup
    cache = model.init_cache(1, max_len=8)
    _, cache = _extend(model, jnp.asarray(seqs[0][None, :6]), cache, jnp.array([6], jnp.int32))
    before = np.asarray(cache.k)[:, :, :6].copy()
    _, cache = _extend(model, jnp.asarray(seqs[0][None, 6:12]), cache, jnp.array([6], jnp.int32))
    np.testing.assert_array_equal(np.asarray(cache.k)[:, :, :6], before)
    assert int(cache.length[0]) == 12


def test_take_selects_rows(setup):
    model, seqs, _, _ = setup
    cache = model.init_cache(3, max_len=8)
    toks = jnp.asarray(np.stack([s[:4] for s in seqs]))
    _, cache = _extend(model, toks, cache, jnp.array([1, 2, 3], jnp.int32))
    sub = cache.take(jnp.array([2, 0]))
    np.testing.assert_array_equal(sub.length, [3, 1])
    np.testing.assert_array_equal(sub.k[:, 0], cache.k[:, 2])
