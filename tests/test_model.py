"""AllieModel: sizes, logical axes, soft Elo tokens, packing, dtypes, and a second implementation.

The reference forward pass below is written independently in numpy from the GPT-2 equations, so
agreement checks the Flax model rather than restating it.
"""

from __future__ import annotations

import dataclasses
import io
import math

import chess.pgn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zstandard
from flax import nnx

from allie_jax import game as game_lib
from allie_jax import vocab
from allie_jax.model import AllieModel, ModelConfig, count_params
from allie_jax.model import sharding as sh
from allie_jax.model.transformer import positions_from_segments


# ---------------------------------------------------------------------------- shared helpers
def load_sample_games(path, n: int) -> list[game_lib.Game]:
    """The first ``n`` games of a ``.pgn.zst`` parsed with python-chess (independent of our parser)."""
    games = []
    with open(path, "rb") as fh:
        text = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8")
        while len(games) < n:
            g = chess.pgn.read_game(text)
            if g is None:
                break
            h = g.headers
            moves = [m.uci() for m in g.mainline_moves()]
            if len(moves) < 10:
                continue
            base, _, inc = h.get("TimeControl", "-").partition("+")
            clocks = [node.clock() for node in g.mainline()]
            think = []
            if base.isdigit() and all(c is not None for c in clocks):
                prev = [float(base), float(base)]
                for i, c in enumerate(clocks):
                    think.append(prev[i % 2] - c + float(inc or 0))
                    prev[i % 2] = c
            result = {"1-0": 1.0, "0-1": -1.0, "1/2-1/2": 0.0}.get(h.get("Result"))
            games.append(
                game_lib.Game(
                    moves=moves,
                    white_elo=int(h["WhiteElo"]),
                    black_elo=int(h["BlackElo"]),
                    time_control=h.get("TimeControl"),
                    result=result,
                    termination=h.get("Termination", "Normal"),
                    think_times=think or None,
                )
            )
    assert len(games) == n, f"only {len(games)} games in {path}"
    return games


def pad_rows(
    seqs: list[np.ndarray], length: int | None = None, fill: int = vocab.PAD
) -> np.ndarray:
    length = length or max(len(s) for s in seqs)
    out = np.full((len(seqs), length), fill, np.int32)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def tiny(**overrides) -> ModelConfig:
    return ModelConfig.named("tiny", **overrides)


# ---------------------------------------------------------------------------- numpy reference
def reference_forward(params: dict, cfg: ModelConfig, tokens: np.ndarray):
    """GPT-2 with soft Elo tokens for one unpacked row, straight from the equations."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    tokens = np.asarray(tokens)
    t = len(tokens)

    def ln(x, q):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.layer_norm_eps) * q["scale"] + q["bias"]

    x = np.zeros((t, cfg.embed_dim))
    for i, tok in enumerate(tokens):
        if tok >= cfg.vocab_size:
            a = (min(max(tok - cfg.vocab_size, 500), 3000) - 500) / 2500
            x[i] = a * p["elo_embed"][0] + (1 - a) * p["elo_embed"][1]
        else:
            x[i] = p["wte"][tok]
    x = x + p["wpe"][:t]
    hd = cfg.head_dim
    for li in range(cfg.num_layers):
        b = p["blocks"][li]
        h = ln(x, b["ln_1"])
        att = b["attn"]
        q = np.einsum("td,dnh->nth", h, att["query"]) + att["query_bias"][:, None]
        k = np.einsum("td,dnh->nth", h, att["key"]) + att["key_bias"][:, None]
        v = np.einsum("td,dnh->nth", h, att["value"]) + att["value_bias"][:, None]
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        o = np.einsum("nts,nsh->tnh", w, v)
        x = x + np.einsum("tnh,nhd->td", o, att["out"]) + att["out_bias"]
        h = ln(x, b["ln_2"])
        m = h @ b["mlp"]["fc"] + b["mlp"]["fc_bias"]
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m**3)))
        x = x + m @ b["mlp"]["proj"] + b["mlp"]["proj_bias"]
    h = ln(x, p["ln_f"])
    logits = h @ p["wte"].T
    value = np.tanh(h @ p["value_head"] + p["value_bias"])[:, 0]
    time = (h @ p["time_head"] + p["time_bias"])[:, 0]
    return logits, time, value


@pytest.fixture(scope="module")
def games(sample_pgn):
    return load_sample_games(sample_pgn, 4)


@pytest.fixture(scope="module")
def model():
    return AllieModel(tiny(), rngs=nnx.Rngs(1))


@nnx.jit
def _forward(model, tokens, segment_ids, positions):
    return model(tokens, segment_ids=segment_ids, positions=positions)


# ---------------------------------------------------------------------------- tests
def test_named_sizes_and_medium_parameter_count():
    medium = ModelConfig.named("allie_medium")
    assert (medium.num_layers, medium.embed_dim, medium.num_heads) == (24, 1024, 16)
    assert medium.vocab_size == 1997
    n = count_params(medium)  # eval_shape: nothing allocated
    assert abs(n - 305.4e6) <= 0.1e6, n
    assert ModelConfig.named("tiny").num_layers == 2 and ModelConfig.named("tiny").embed_dim == 64
    assert ModelConfig.named("allie_124m").embed_dim == 768
    assert ModelConfig.named("allie_large").num_layers == 36
    assert ModelConfig.named("tiny", dtype="bfloat16").dtype == "bfloat16"


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        ModelConfig.named("huge")
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig(embed_dim=65, num_heads=4)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(dtype="float8")
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({"width": 3})
    cfg = tiny(dropout=0.0)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_every_parameter_has_logical_axis_names(model):
    params = nnx.state(model, nnx.Param)
    for path, var in jax.tree.leaves_with_path(
        params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    ):
        names = var.get_metadata().get("out_sharding")
        assert names is not None and len(names) == var[...].ndim, (path, names)
        assert all(n is None or n in sh.LOGICAL_AXES for n in names), (path, names)
    assert params["wte"].get_metadata()["out_sharding"] == ("vocab", "embed")
    assert params["blocks"][0]["mlp"]["fc"].get_metadata()["out_sharding"] == ("embed", "mlp")


def test_soft_elo_embedding_interpolates_strong_and_weak(model):
    e = np.asarray(model.elo_embed[...])
    wpe = np.asarray(model.wpe[...])
    toks = jnp.array([[vocab.ELO_OFFSET + 1750, vocab.ELO_OFFSET + 400, vocab.ELO_OFFSET + 3100]])
    x = np.asarray(model.embed(toks, jnp.array([[0, 1, 2]])))
    np.testing.assert_allclose(x[0, 0], 0.5 * e[0] + 0.5 * e[1] + wpe[0], atol=1e-6)
    np.testing.assert_allclose(x[0, 1], e[1] + wpe[1], atol=1e-6)  # clamped to 500: weak
    np.testing.assert_allclose(x[0, 2], e[0] + wpe[2], atol=1e-6)  # clamped to 3000: strong
    x = np.asarray(model.embed(jnp.array([[757]]), jnp.array([[5]])))
    np.testing.assert_allclose(x[0, 0], np.asarray(model.wte[...])[757] + wpe[5], atol=1e-6)


def test_forward_matches_numpy_reference_on_a_real_game(model, games):
    enc = game_lib.encode_game(games[0])
    tokens = enc.tokens[None]
    out = _forward(model, jnp.asarray(tokens), None, None)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    logits, time, value = reference_forward(params, model.config, enc.tokens)
    assert out.policy_logits.dtype == jnp.float32
    assert out.policy_logits.shape == (1, len(enc.tokens), 1997)
    np.testing.assert_allclose(out.policy_logits[0], logits, atol=1e-4)
    np.testing.assert_allclose(out.time[0], time, atol=1e-4)
    np.testing.assert_allclose(out.value[0], value, atol=1e-4)


def test_packed_games_do_not_attend_across_segments(model, games):
    a = game_lib.encode_game(games[1]).tokens
    b = game_lib.encode_game(games[2]).tokens
    row = np.concatenate([a, b, np.full(7, vocab.PAD, np.int32)])[None]
    seg = np.concatenate([np.ones(len(a)), 2 * np.ones(len(b)), np.zeros(7)]).astype(np.int32)[None]
    pos = positions_from_segments(jnp.asarray(seg))
    expected_pos = np.concatenate([np.arange(len(a)), np.arange(len(b)), np.arange(7)])
    np.testing.assert_array_equal(pos[0], expected_pos)
    packed = _forward(model, jnp.asarray(row), jnp.asarray(seg), pos)
    alone = _forward(model, jnp.asarray(pad_rows([a, b])), None, None)
    np.testing.assert_allclose(
        packed.policy_logits[0, : len(a)], alone.policy_logits[0, : len(a)], atol=1e-5
    )
    np.testing.assert_allclose(
        packed.policy_logits[0, len(a) : len(a) + len(b)],
        alone.policy_logits[1, : len(b)],
        atol=1e-5,
    )
    np.testing.assert_allclose(
        packed.value[0, len(a) : len(a) + len(b)], alone.value[1, : len(b)], atol=1e-5
    )
    np.testing.assert_allclose(
        packed.time[0, len(a) : len(a) + len(b)], alone.time[1, : len(b)], atol=1e-5
    )


def test_bfloat16_computation_keeps_float32_params_and_outputs(games):
    cfg32 = tiny()
    m32 = AllieModel(cfg32, rngs=nnx.Rngs(3))
    m16 = AllieModel(dataclasses.replace(cfg32, dtype="bfloat16"), rngs=nnx.Rngs(3))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(m16, nnx.Param)))
    tokens = jnp.asarray(game_lib.encode_game(games[0]).tokens[None])
    o32, o16 = _forward(m32, tokens, None, None), _forward(m16, tokens, None, None)
    assert o16.policy_logits.dtype == jnp.float32 and o16.value.dtype == jnp.float32
    p32 = jax.nn.softmax(o32.policy_logits)
    p16 = jax.nn.softmax(o16.policy_logits)
    assert float(jnp.abs(p32 - p16).max()) < 2e-2
    assert float(jnp.abs(o32.value - o16.value).max()) < 5e-2


def test_dropout_only_in_training_and_remat_gives_same_gradients(games):
    tokens = jnp.asarray(game_lib.encode_game(games[0]).tokens[None, :32])
    m = AllieModel(tiny(), rngs=nnx.Rngs(0))
    run = nnx.jit(lambda m, t, det: m(t, deterministic=det).policy_logits, static_argnums=2)
    a, b, c = run(m, tokens, True), run(m, tokens, True), run(m, tokens, False)
    np.testing.assert_array_equal(a, b)
    assert float(jnp.abs(a - c).max()) > 1e-3

    @nnx.jit
    def grads(model):
        return nnx.grad(lambda m: jnp.mean(m(tokens).policy_logits ** 2))(model)

    g1 = grads(AllieModel(tiny(dropout=0.0), rngs=nnx.Rngs(0)))
    g2 = grads(AllieModel(tiny(dropout=0.0, remat=True), rngs=nnx.Rngs(0)))
    for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_logical_constraints_apply_under_a_mesh(games):
    from flax.core import spmd

    model = AllieModel(tiny(), rngs=nnx.Rngs(1))
    tokens = jnp.asarray(game_lib.encode_game(games[0]).tokens[None])
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh), spmd.logical_axis_rules([("batch", "data")]):
        assert sh.logical_to_spec(("batch", "embed")) == jax.sharding.PartitionSpec("data", None)
        out = _forward(model, tokens, None, None)
    ref = _forward(AllieModel(tiny(), rngs=nnx.Rngs(1)), tokens, None, None)
    np.testing.assert_allclose(out.policy_logits, ref.policy_logits, atol=1e-6)


def test_logical_constraints_apply_under_an_auto_mesh(games):
    from flax.core import spmd

    model = AllieModel(tiny(), rngs=nnx.Rngs(1))
    tokens = jnp.asarray(game_lib.encode_game(games[0]).tokens[None])
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh), spmd.logical_axis_rules([("batch", "data"), ("mlp", None)]):
        out = _forward(model, tokens, None, None)
    ref = _forward(AllieModel(tiny(), rngs=nnx.Rngs(1)), tokens, None, None)
    np.testing.assert_allclose(out.policy_logits, ref.policy_logits, atol=1e-6)


REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
