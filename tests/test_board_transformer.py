"""The board-state transformer (seed 001): token layout, flip, masking, refinement, feedback.

References are independent of the model's code: python-chess for legality and mirroring
(``Board.mirror``), numpy for the top-3 / refined distribution, hand formulas for the scalings.
"""

from __future__ import annotations

import itertools

import chess
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.data import board_features as bf
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.model.board_transformer import (
    BoardConfig,
    BoardTransformer,
    count_params,
    mirror_moves,
    relative_offsets,
)
from allie_jax.pgn import read_games


@pytest.fixture(scope="module")
def real_batch(sample_pgn):
    games = [g for g in itertools.islice(read_games(sample_pgn), 40) if len(g.moves) > 30][:3]
    examples = [e for g in games for e in bf.game_examples(g)]
    return bf.stack(examples[::7][:24])


def _model(**kw) -> BoardTransformer:
    kw.setdefault("num_layers", 2)
    return BoardTransformer(BoardConfig.named("board_tiny", **kw), rngs=nnx.Rngs(1))


def _run(model: BoardTransformer, inputs, **kw):
    """One jitted forward (eager op-by-op dispatch is far slower on a loaded CPU)."""
    return nnx.jit(lambda m, x: m(x, **kw))(model, inputs)


def _inputs(batch):
    return {k: jnp.asarray(batch[k]) for k in bf.INPUT_FIELDS}


def test_seed_token_layout(real_batch):
    cfg = BoardConfig.named("board_tiny", use_elo=False, num_layers=2)
    # every token the seed lists: CLS + 64 + side + 4 + 9 + rep + half + full + 3 (it says 84)
    assert cfg.num_tokens == 85
    model = BoardTransformer(cfg)
    ctx = model.context_tokens(_inputs(real_batch))
    assert ctx.shape == (len(real_batch["side"]), 82, cfg.embed_dim)
    assert BoardConfig.named("board_tiny", flip=True, use_elo=False).num_tokens == 84
    assert BoardConfig.named("board_tiny", piece_scheme="9_tokens").num_tokens == 87 + 64
    assert 260e6 < count_params(BoardConfig.named("board_270m")) < 280e6


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="piece_scheme"):
        BoardConfig(piece_scheme="12")
    with pytest.raises(ValueError, match="feedback"):
        BoardConfig(num_layers=2, feedback_cycles=1, feedback_from=1, feedback_to=5)
    with pytest.raises(ValueError, match="unknown board model size"):
        BoardConfig.named("board_huge")
    cfg = BoardConfig.named("board_tiny", flip=True)
    assert BoardConfig.from_dict(cfg.to_dict()) == cfg


def test_mirror_moves_is_the_python_chess_mirror():
    perm = mirror_moves()
    assert (perm[perm] == np.arange(vocab.NUM_MOVES)).all()
    for uci in ("e2e4", "g1f3", "e1g1", "a7a8q", "b2a1n"):
        m = chess.Move.from_uci(uci)
        mirrored = chess.Move(
            chess.square_mirror(m.from_square), chess.square_mirror(m.to_square), m.promotion
        )
        assert vocab.MOVES[perm[vocab.MOVE_TO_ID[uci]]] == mirrored.uci()


def test_relative_offsets_depend_only_on_the_square_difference():
    off = relative_offsets()
    sq = chess.parse_square
    assert off[sq("a1"), sq("b2")] == off[sq("c3"), sq("d4")] == off[sq("g7"), sq("h8")]
    assert off[sq("a1"), sq("b2")] != off[sq("b2"), sq("a1")]
    assert off[sq("a1"), sq("b1")] != off[sq("a1"), sq("a2")]
    assert len(np.unique(off)) == 15 * 15
    model = _model(use_elo=False)
    model.relative_bias[...] = jax.random.normal(jax.random.key(0), model.relative_bias.shape)
    bias = np.asarray(model.attention_bias())[0]
    assert np.all(bias[:, 0] == 0) and np.all(bias[:, 65:] == 0) and np.all(bias[:, :, 65:] == 0)
    assert bias[3, 1 + sq("a1"), 1 + sq("b2")] == bias[3, 1 + sq("c3"), 1 + sq("d4")] != 0


def _mirror_pair():
    """A real middlegame position with White to move, and python-chess's colour mirror of it."""
    board = chess.Board("r1bqk2r/pppp1ppp/2n2n2/2b1p3/2B1P3/3P1N2/PPP2PPP/RNBQK2R w KQkq - 3 5")
    return board, board.mirror()


def test_flip_makes_the_model_colour_symmetric():
    board, mirrored = _mirror_pair()
    assert mirrored.turn == chess.BLACK
    batch = bf.board_inputs([board, mirrored], white_elos=[1500, 1700], black_elos=[1700, 1500])
    for flip in (True, False):
        model = _model(flip=flip)
        model.policy_bias[...] = jax.random.normal(jax.random.key(2), model.policy_bias.shape)
        out = _run(model, _inputs(batch))
        lp = np.asarray(out.final_log_probs)
        same = np.allclose(lp[1], lp[0][mirror_moves()], atol=1e-5)
        if flip:
            assert same
            np.testing.assert_allclose(out.value[1], -out.value[0], atol=1e-6)
            r = np.asarray(out.rights_logits)
            np.testing.assert_allclose(r[1], r[0][[2, 3, 0, 1, *range(4, 13)]], atol=1e-5)
            assert list(out.candidates[1]) == list(mirror_moves()[np.asarray(out.candidates[0])])
        else:
            assert not same  # absolute pieces + side token: no built-in symmetry


def test_masking_puts_all_mass_on_legal_moves(real_batch):
    inputs = _inputs(real_batch)
    legal = np.asarray(real_batch["move_info"]) >= 0
    for mask in (True, False):
        out = _run(_model(mask_illegal=mask, refinement=False), inputs)
        probs = np.exp(np.asarray(out.final_log_probs))
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
        illegal_mass = (probs * ~legal).sum(-1)
        if mask:
            assert illegal_mass.max() < 1e-6
        else:
            assert illegal_mass.min() > 0.5  # an untrained unmasked policy is mostly illegal
    # the legal set is python-chess's
    board = chess.Board()
    info = bf.position_features(board)["move_info"]
    assert {vocab.MOVES[i] for i in np.flatnonzero(info >= 0)} == {
        m.uci() for m in board.legal_moves
    }


def test_refinement_candidates_and_final_distribution(real_batch):
    model = _model()
    model.choice_head[...] = jax.random.normal(jax.random.key(3), model.choice_head.shape)
    out = _run(model, _inputs(real_batch))
    logits = np.asarray(out.policy_logits)
    legal = np.asarray(real_batch["move_info"]) >= 0
    lp1 = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    final = np.asarray(out.final_log_probs)
    choice = np.asarray(out.choice_logits)
    for b in range(len(logits)):
        order = [i for i in np.argsort(-logits[b], kind="stable") if legal[b, i]][:3]
        assert set(order) == set(np.asarray(out.candidates[b]))
        cand = np.asarray(out.candidates[b])
        q = np.exp(choice[b] - choice[b].max())
        q /= q.sum()
        mass = np.exp(lp1[b, cand]).sum()
        expected = lp1[b].copy()
        expected[cand] = np.log(mass * q)
        np.testing.assert_allclose(final[b][legal[b]], expected[legal[b]], atol=1e-4)
        assert final[b].argmax() == cand[choice[b].argmax()]
    skipped = _run(model, _inputs(real_batch), refine=False)
    np.testing.assert_allclose(np.asarray(skipped.final_log_probs)[legal], lp1[legal], atol=1e-4)
    assert np.all(np.asarray(skipped.choice_logits) == 0)


@pytest.mark.slow  # a few more compiles; run by make test-all
def test_fewer_than_three_legal_moves():
    board = chess.Board("7k/8/8/8/8/8/6q1/7K w - - 0 1")  # Kxg2 only
    batch = bf.board_inputs([board])
    out = _run(_model(), _inputs(batch))
    assert list(np.asarray(out.candidates[0])) == [vocab.MOVE_TO_ID["h1g2"], -1, -1]
    assert np.exp(out.final_log_probs[0, vocab.MOVE_TO_ID["h1g2"]]) == pytest.approx(1.0, abs=1e-5)


def test_scalings_and_soft_elo_tokens_match_the_seed_formulas():
    board = chess.Board("8/8/4k3/8/8/4K3/8/8 w - - 37 61")
    batch = bf.board_inputs([board], white_elos=[1812], black_elos=[0])
    model = _model()
    ctx = np.asarray(model.context_tokens(_inputs(batch)))[0]
    # CLS, 64 squares, side, 4 castling, 9 ep, repetition, half, full, elo white, elo black
    half, full, elo_w, elo_b = ctx[80], ctx[81], ctx[82], ctx[83]
    np.testing.assert_allclose(half, 37 / 50 * np.asarray(model.halfmove[...])[0], rtol=1e-6)
    e16 = 61 / 100 * np.asarray(model.fullmove[...])
    np.testing.assert_allclose(full, e16 @ np.asarray(model.fullmove_matrix[...]), atol=1e-6)
    a = (1812 - 500) / 2500
    strong, weak = np.asarray(model.elo_embed[...])
    role = np.asarray(model.elo_role[...])
    np.testing.assert_allclose(elo_w, a * strong + (1 - a) * weak + role[0], rtol=1e-5)
    np.testing.assert_allclose(elo_b, np.asarray(model.elo_unknown[...])[0] + role[1], rtol=1e-5)
    poly = _model(halfmove_degree=8)
    ctx8 = np.asarray(poly.context_tokens(_inputs(batch)))[0]
    x = 37 / 150
    np.testing.assert_allclose(
        ctx8[80], sum(x**k * np.asarray(poly.halfmove[...])[k - 1] for k in range(1, 9)), rtol=1e-5
    )


def test_decoder_soft_elo_is_the_same_rule():
    model = AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))
    tokens = jnp.asarray([[vocab.encode_elo(1812), vocab.encode_elo(200)]])
    x = (
        np.asarray(model.embed(tokens, jnp.zeros((1, 2), jnp.int32)))[0]
        - np.asarray(model.wpe[...])[0]
    )
    strong, weak = np.asarray(model.elo_embed[...])
    a = (1812 - 500) / 2500
    np.testing.assert_allclose(x[0], a * strong + (1 - a) * weak, rtol=1e-5)
    np.testing.assert_allclose(x[1], weak, rtol=1e-5)  # clipped at 500


@pytest.mark.slow  # a few more compiles; run by make test-all
def test_nine_embedding_schemes(real_batch):
    inputs = _inputs(real_batch)
    for scheme in ("9_add", "9_tokens"):
        model = _model(piece_scheme=scheme)
        squares = np.asarray(model._squares(inputs["squares"].astype(jnp.int32)))
        t = np.asarray(model.piece_type[...])
        c = np.asarray(model.piece_colour[...])
        pos = np.asarray(model.square_pos[...])
        s = np.asarray(real_batch["squares"][0], int)
        for sq in (0, 12, 52, 36):  # a1 rook, e2 pawn, e7 pawn, e5 (may be empty)
            state = s[sq]
            ptype = 0 if state == 0 else (state - 1) % 6 + 1
            colour = np.zeros_like(c[0]) if state == 0 else c[int(state >= 7)]
            if scheme == "9_add":
                np.testing.assert_allclose(squares[0, sq], t[ptype] + colour + pos[sq], rtol=1e-5)
            else:
                assert squares.shape[1] == 128
                np.testing.assert_allclose(squares[0, sq], t[ptype] + pos[sq], rtol=1e-5)
                want = t[0] if state == 0 else colour
                np.testing.assert_allclose(squares[0, 64 + sq], want + pos[sq], rtol=1e-5)
        assert _run(model, inputs).policy_logits.shape == (len(real_batch["side"]), vocab.NUM_MOVES)


@pytest.mark.slow  # a few more compiles; run by make test-all
def test_feedback_cycles_rerun_the_chosen_blocks(real_batch):
    cfg = BoardConfig.named("board_tiny", feedback_cycles=2, feedback_from=1, feedback_to=2)
    model = BoardTransformer(cfg, rngs=nnx.Rngs(4))
    plain = BoardTransformer(BoardConfig.named("board_tiny"), rngs=nnx.Rngs(4))
    inputs = _inputs(real_batch)
    ctx = model.context_tokens(inputs)
    x0 = jnp.concatenate([ctx, model.empty_slots(ctx.shape[0])], axis=1)
    x = x0
    bias = model.attention_bias()
    for i in (0, 1, 2, 1, 2, 1, 2, 3):
        x = model.blocks[i](x, bias, True)
    np.testing.assert_allclose(model.encode(x0), np.asarray(model.ln_f(x)), atol=1e-5)
    assert not np.allclose(model.encode(x0), plain.encode(x0), atol=1e-3)


def test_polynomial_exp_and_gelu_match_jax_values_and_gradients():
    """The board attention's ``exp_nonpositive`` and the MLP's ``gelu_tanh`` against JAX's own
    ``jnp.exp`` / ``jax.nn.gelu(approximate=True)``: values to float32 rounding, and finite
    gradients equal to JAX's where a score is masked (−1e9, −inf)."""
    from allie_jax.model.board_transformer import exp_nonpositive, gelu_tanh

    xs = jnp.linspace(-87.0, 0.0, 100_001)
    np.testing.assert_allclose(exp_nonpositive(xs), jnp.exp(xs), rtol=3e-7, atol=0)
    masked = jnp.array([-jnp.inf, -1e9, -100.0, -87.5])
    np.testing.assert_array_equal(exp_nonpositive(masked), 0.0)
    points = jnp.concatenate([masked, jnp.array([-50.0, -1.0, -1e-3, 0.0])])
    grad = jax.grad(lambda x: exp_nonpositive(x).sum())(points)
    assert np.isfinite(np.asarray(grad)).all(), grad
    np.testing.assert_allclose(grad, jax.grad(lambda x: jnp.exp(x).sum())(points), rtol=3e-7)

    gs = jnp.linspace(-30.0, 30.0, 100_001)
    np.testing.assert_allclose(gelu_tanh(gs), jax.nn.gelu(gs, approximate=True), atol=1e-6)
    ours = jax.grad(lambda x: gelu_tanh(x).sum())(gs)
    theirs = jax.grad(lambda x: jax.nn.gelu(x, approximate=True).sum())(gs)
    # JAX's float32 tanh saturates to ±1 a little earlier: its gradient is 0 where ours is ~3e-6
    np.testing.assert_allclose(ours, theirs, atol=5e-6)
