"""allie_jax.chess_jax against python-chess: legal-move sets, positions and game ends at every ply.

Games are replayed in batches by one jitted scan that records, at each ply, the legal mask, the
piece placement and both rule sets' game end; python-chess replays the same games move by move.
"""

from __future__ import annotations

import io
import random

import chess
import chess.pgn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zstandard

from allie_jax import chess_jax, vocab
from allie_jax.chess_jax import mapping

BATCH = 64


# ---------------------------------------------------------------- reference (python-chess)


def ref_standard(board: chess.Board) -> tuple[bool, float]:
    """The "standard" rule: threefold and the 50-move rule end the game automatically."""
    mate = board.is_checkmate()
    done = (
        mate
        or board.is_stalemate()
        or board.is_insufficient_material()
        or board.is_repetition(3)
        or board.halfmove_clock >= 100
    )
    return done, _mate_result(board, mate)


def ref_released(board: chess.Board) -> tuple[bool, float]:
    """The released code's rule: ``is_game_over(claim_draw=False)``."""
    mate = board.is_checkmate()
    return board.is_game_over(claim_draw=False), _mate_result(board, mate)


def _mate_result(board: chess.Board, mate: bool) -> float:
    if not mate:
        return 0.0
    return -1.0 if board.turn == chess.WHITE else 1.0


# ---------------------------------------------------------------- games


def biased_random_game(rng: random.Random, max_plies: int, shuffle: bool) -> chess.Board:
    """A random game that favours castling, en passant and under-promotions.

    With ``shuffle`` the players often take back their own last move, so positions repeat.
    """
    board = chess.Board()
    while len(board.move_stack) < max_plies and not board.is_game_over(claim_draw=False):
        moves = list(board.legal_moves)
        special = [
            m
            for m in moves
            if board.is_castling(m)
            or board.is_en_passant(m)
            or (m.promotion is not None and (m.promotion != chess.QUEEN or rng.random() < 0.3))
        ]
        if special and rng.random() < 0.7:
            board.push(rng.choice(special))
        elif shuffle and len(board.move_stack) > 40 and rng.random() < 0.3:
            # Undo one's own last move now and then, so that repetitions are common.
            last = board.move_stack[-2] if len(board.move_stack) >= 2 else None
            back = last and chess.Move(last.to_square, last.from_square)
            board.push(back if back and board.is_legal(back) else rng.choice(moves))
        else:
            board.push(rng.choice(moves))
    return board


def random_games(n: int, seed: int, max_plies: int = 400) -> list[chess.Board]:
    rng = random.Random(seed)
    return [biased_random_game(rng, max_plies, shuffle=i % 2 == 0) for i in range(n)]


def real_games(path, limit: int | None) -> list[chess.Board]:
    boards = []
    with open(path, "rb") as fh:
        text = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8")
        while limit is None or len(boards) < limit:
            game = chess.pgn.read_game(text)
            if game is None:
                break
            board = game.board()
            for move in game.mainline_moves():
                board.push(move)
            boards.append(board)
    return boards


def shuffle_game(prefix: list[str], cycles: int) -> list[str]:
    """``prefix`` then knight shuffles that return to the same position every 4 plies."""
    return prefix + ["g1f3", "g8f6", "f3g1", "f6g8"] * cycles


# ---------------------------------------------------------------- the batched trajectory

CHUNK = 1024  # positions per legal-mask call: one compilation for every test


@jax.jit
def _all_states(move_ids: jax.Array) -> chess_jax.ChessState:
    """The states at plies 0..T of each row (stacked on a leading ply axis)."""
    state0 = chess_jax.initial_state(move_ids.shape[0])

    def step(s, ids):
        s = chess_jax.apply(s, ids)
        return s, s

    _, rest = jax.lax.scan(step, state0, move_ids.T)
    return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), state0, rest)


@jax.jit
def _record(s: chess_jax.ChessState):
    """Packed legal mask and (done, result) under both rule sets, for a flat batch of states."""
    mask = chess_jax.legal_mask(s)
    # The standard rule goes through outcome()'s own mask computation, the released one reuses ours.
    std = chess_jax.outcome(s._replace(released=jnp.zeros_like(s.released)))
    rel = chess_jax.outcome(s._replace(released=jnp.ones_like(s.released)), mask)
    return jnp.packbits(mask, axis=-1), std, rel


def _board_planes(board: chess.Board) -> np.ndarray:
    """pgx's side-relative board of a python-chess position (int8 [64])."""
    out = np.zeros(64, np.int8)
    black = board.turn == chess.BLACK
    for square, piece in board.piece_map().items():
        file, rank = chess.square_file(square), chess.square_rank(square)
        rel_rank = 7 - rank if black else rank
        value = piece.piece_type if piece.color == board.turn else -piece.piece_type
        out[file * 8 + rel_rank] = value
    return out


def trajectories(games: list[chess.Board]) -> list[dict[str, np.ndarray]]:
    """Per game, per ply 0..N: legal mask, board, colour and both rule sets' (done, result)."""
    flat = []
    for start in range(0, len(games), BATCH):
        chunk = games[start : start + BATCH]
        ids = [chess_jax.board_to_move_ids(b) for b in chunk]
        width = max(512, -(-max(len(i) for i in ids) // 128) * 128)  # one compilation, mostly
        move_ids, _ = chess_jax.pad_move_ids(ids + [[]] * (BATCH - len(ids)), width)
        states = jax.device_get(_all_states(move_ids))
        for b, game in enumerate(chunk):
            n = len(game.move_stack) + 1
            flat.append(jax.tree.map(lambda x, b=b, n=n: x[:n, b], states))
    states = jax.tree.map(lambda *xs: np.concatenate(xs), *flat)
    total = states.ply.shape[0]
    out = []
    for start in range(0, total, CHUNK):
        idx = np.minimum(np.arange(start, start + CHUNK), total - 1)
        out.append(jax.device_get(_record(jax.tree.map(lambda x, idx=idx: x[idx], states))))
    packed, std, rel = jax.tree.map(lambda *xs: np.concatenate(xs)[:total], *out)
    masks = np.unpackbits(packed, axis=-1)[:, : vocab.NUM_MOVES].astype(bool)
    result, offset = [], 0
    for game in games:
        sl = slice(offset, offset + len(game.move_stack) + 1)
        offset = sl.stop
        result.append(
            dict(
                mask=masks[sl],
                board=states.board[sl],
                color=states.color[sl],
                standard=(std[0][sl], std[1][sl]),
                released=(rel[0][sl], rel[1][sl]),
            )
        )
    return result


def compare_games(games: list[chess.Board]) -> dict[str, int]:
    """Assert agreement at every ply of every game; return counts of what was covered."""
    stats = {"positions": 0, "black_to_move": 0}
    for g, (game, ours) in enumerate(zip(games, trajectories(games), strict=True)):
        board = chess.Board()
        for ply in range(len(game.move_stack) + 1):
            where = f"game {g} ply {ply} fen {board.fen()}"
            expected = {m.uci() for m in board.legal_moves}
            got = {vocab.MOVES[i] for i in np.flatnonzero(ours["mask"][ply])}
            assert got == expected, f"{where}: missing {expected - got}, extra {got - expected}"
            np.testing.assert_array_equal(ours["board"][ply], _board_planes(board), err_msg=where)
            assert ours["color"][ply] == (0 if board.turn else 1), where
            for name, ref in (("standard", ref_standard), ("released", ref_released)):
                done, result = ref(board)
                got_end = (bool(ours[name][0][ply]), float(ours[name][1][ply]))
                assert got_end == (done, result), f"{where}: {name} {got_end} != {(done, result)}"
            _count(stats, board)
            if ply < len(game.move_stack):
                board.push(game.move_stack[ply])
    return stats


def _count(stats: dict[str, int], board: chess.Board) -> None:
    stats["positions"] += 1
    stats["black_to_move"] += board.turn == chess.BLACK
    features = {
        "castling": any(board.is_castling(m) for m in board.legal_moves),
        "en_passant": board.has_legal_en_passant(),
        "en_passant_illegal": board.has_pseudo_legal_en_passant()
        and not board.has_legal_en_passant(),
        "en_passant_evasion": board.is_check() and board.has_legal_en_passant(),
        "underpromotion": any(m.promotion not in (None, chess.QUEEN) for m in board.legal_moves),
        "checkmate": board.is_checkmate(),
        "stalemate": board.is_stalemate(),
        "insufficient": board.is_insufficient_material(),
        "threefold": board.is_repetition(3),
        "fivefold": board.is_repetition(5),
        "fifty": board.halfmove_clock >= 100,
        "seventyfive": board.halfmove_clock >= 150,
    }
    for name, hit in features.items():
        stats[name] = stats.get(name, 0) + int(hit)


# ---------------------------------------------------------------- tests


def test_mapping_tables_round_trip():
    for color in (0, 1):
        for i, move in enumerate(vocab.MOVES):
            action = mapping.VOCAB_TO_PGX[color, i]
            if action == mapping.NO_ACTION:
                continue
            back = mapping.PGX_TO_VOCAB_PAWN if mapping.MOVE_KIND[i] else mapping.PGX_TO_VOCAB
            assert back[color, action] == i, (color, move)
    # Every move has an action for the side whose direction it fits; pawn-only moves for one side.
    assert (mapping.VOCAB_TO_PGX[0] != mapping.NO_ACTION).sum() == vocab.NUM_MOVES - 88
    assert (mapping.VOCAB_TO_PGX[1] != mapping.NO_ACTION).sum() == vocab.NUM_MOVES - 88
    # Castling is the king's two-square move in both tables.
    assert mapping.VOCAB_TO_PGX[0, vocab.encode_move("e1g1")] == 2367
    assert mapping.VOCAB_TO_PGX[1, vocab.encode_move("e8c8")] == 2364


def test_initial_position():
    state = chess_jax.initial_state(3)
    assert np.asarray(chess_jax.white_to_move(state)).all()
    assert chess_jax.board_fen(state, 1) == chess.STARTING_BOARD_FEN + " w"
    assert compare_games([chess.Board()])["positions"] == 1


def quiet_game(rng: random.Random, plies: int) -> list[str]:
    """An opening, then ``plies`` random moves without captures, pawn moves, checks or threefolds.

    It reaches the 50-move and 75-move rules, which random play rarely does before the material runs out.
    """
    board = chess.Board()
    for uci in "e2e4 e7e5 d2d3 d7d6 g2g3 g7g6 b2b3 b7b6".split():
        board.push_uci(uci)
    for _ in range(plies):
        candidates = []
        for move in board.legal_moves:
            if board.is_zeroing(move) or board.gives_check(move):
                continue
            board.push(move)
            if not board.is_repetition(3):
                candidates.append(move)
            board.pop()
        if not candidates:
            break
        board.push(rng.choice(candidates))
    return [m.uci() for m in board.move_stack]


def test_constructed_game_ends():
    """Threefold vs fivefold, en passant identity, mates (both colours), stalemate, material."""
    ep = ["e2e4", "b8c6", "e4e5", "d7d5"]  # exd6 is legal right after d5: that position differs
    games = [
        shuffle_game([], 2),  # start position the 3rd time: standard over, released not
        shuffle_game([], 4),  # 5th time: released over too
        shuffle_game(ep, 3),
        shuffle_game(["e2e4", "e7e5"], 5),
        ["f2f3", "e7e5", "g2g4", "d8h4"],  # fool's mate: Black mates
        ["e2e4", "e7e5", "f1c4", "b8c6", "d1h5", "g8f6", "h5f7"],  # scholar's mate: White mates
        # Sam Loyd's 10-move stalemate.
        "e2e3 a7a5 d1h5 a8a6 h5a5 h7h5 h2h4 a6h6 a5c7 f7f6 c7d7 e8f7 d7b7 d8d3 b7b8 d3h7 b8c8 f7g6 c8e6".split(),
        # exd6 e.p. would expose the king on g5 to the rook on a5: the d6 square is not part of
        # the position's identity, so the knight shuffles repeat the position after 6...d5.
        "e2e4 h7h5 e4e5 h8h6 e1e2 h6a6 e2e3 a6a5 e3f4 b8c6 f4g5 d7d5".split()
        + ["g1f3", "c6b8", "f3g1", "b8c6"] * 2,
        # 6.e4+ is answered by dxe3 e.p. (or a king move).
        "a2a3 d7d5 a3a4 d5d4 b2b3 e8d7 b3b4 d7d6 a4a5 d6d5 e2e4 d4e3".split(),
        quiet_game(random.Random(0), 160),
        quiet_game(random.Random(1), 200),
    ]
    boards = []
    for moves in games:
        board = chess.Board()
        for m in moves:
            board.push_uci(m)
        boards.append(board)
    stats = compare_games(boards)
    for feature in (
        "threefold",
        "fivefold",
        "checkmate",
        "stalemate",
        "en_passant",
        "en_passant_illegal",
        "en_passant_evasion",
        "fifty",
        "seventyfive",
    ):
        assert stats[feature] > 0, feature


def test_random_games_match_python_chess():
    stats = compare_games(random_games(48, seed=1))
    assert stats["positions"] >= 8000, stats
    for feature in (
        "castling",
        "en_passant",
        "underpromotion",
        "insufficient",
        "threefold",
        "checkmate",
    ):
        assert stats[feature] > 0, (feature, stats)
    assert stats["black_to_move"] > stats["positions"] // 3


def test_real_games_match_python_chess(sample_pgn):
    stats = compare_games(real_games(sample_pgn, limit=128))
    assert stats["positions"] >= 8000, stats


@pytest.mark.slow
def test_many_random_games_match_python_chess():
    stats = compare_games(random_games(256, seed=2, max_plies=600))
    for feature in ("checkmate", "stalemate", "threefold", "fivefold", "fifty", "seventyfive"):
        assert stats[feature] > 0, (feature, stats)


@pytest.mark.slow
def test_all_real_games_match_python_chess(sample_pgn):
    stats = compare_games(real_games(sample_pgn, limit=None))
    assert stats["positions"] >= 20000, stats


def test_replay_equals_stepwise_apply_and_works_under_vmap():
    boards = random_games(4, seed=3, max_plies=60)
    ids, lengths = chess_jax.pad_move_ids([chess_jax.board_to_move_ids(b) for b in boards], 64)
    replayed = chess_jax.replay(ids, lengths, rules="released")
    assert np.asarray(replayed.released).all()
    for b, board in enumerate(boards):
        assert chess_jax.board_fen(replayed, b) == " ".join(board.fen().split()[:2])
        assert int(replayed.halfmove[b]) == board.halfmove_clock
        assert int(replayed.ply[b]) == len(board.move_stack)
    # Prefix replay stops at each row's length.
    half = chess_jax.replay(ids, lengths // 2)
    for b, board in enumerate(boards):
        prefix = chess.Board()
        for m in board.move_stack[: len(board.move_stack) // 2]:
            prefix.push(m)
        assert chess_jax.board_fen(half, b) == " ".join(prefix.fen().split()[:2])
    # A state is a pytree: vmap over an extra leading axis works like the plain batch.
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), half)
    moved = jax.vmap(chess_jax.apply)(stacked, jnp.stack([ids[:, 0], ids[:, 0]]))
    np.testing.assert_array_equal(moved.board[1], chess_jax.apply(half, ids[:, 0]).board)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="rules"):
        chess_jax.replay(np.zeros((1, 1), np.int32), np.zeros(1, np.int32), rules="fide")
    with pytest.raises(ValueError, match="move_ids"):
        chess_jax.replay(np.zeros(3, np.int32), np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="lengths"):
        chess_jax.replay(np.zeros((2, 3), np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="standard position"):
        chess_jax.board_to_move_ids(chess.Board("8/8/8/8/8/8/8/K6k w - - 0 1"))
    with pytest.raises(ValueError, match="vocabulary"):
        chess_jax.uci_to_move_ids(["e2e4", "a1a1"])


_FIRST_USE_IN_A_TRACE = r"""
import sys

import chess
import jax
import numpy as np

from allie_jax import chess_jax, vocab

assert "pgx._src.games.chess" not in sys.modules, "chess_jax imported pgx's rules at import"
games = [
    "e2e4 e7e5 g1f3 b8c6 f1b5 a7a6 b5a4 g8f6 e1g1",
    "e2e4 d7d5 e4e5 f7f5",  # en passant available: e5f6
    "g2g4 e7e5 f2f3",  # Black mates with d8h4
]
moves, lengths = chess_jax.pad_move_ids([chess_jax.uci_to_move_ids(g.split()) for g in games])


@jax.jit
def legal(moves, lengths):  # the first use of pgx's rules is inside this trace
    return chess_jax.legal_mask(chess_jax.replay(moves, lengths))


mask = np.asarray(legal(moves, lengths))
assert "pgx._src.games.chess" in sys.modules
for row, game in zip(mask, games, strict=True):
    board = chess.Board()
    for m in game.split():
        board.push_uci(m)
    want = sorted(vocab.encode_move(m.uci()) for m in board.legal_moves)
    assert np.flatnonzero(row).tolist() == want, (game, np.flatnonzero(row).tolist(), want)
print("ok")
"""


def test_pgx_loads_at_first_use_even_inside_a_trace():
    """pgx's rules (eager JAX at import) load when a trace first needs them, not when
    chess_jax is imported (a warm engine traces no chess rules); a first use inside ``jax.jit``
    still gives python-chess's legal moves (pgx's tables are built eagerly, not staged into the
    caller's trace). A fresh process: this one imported pgx long ago."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FIRST_USE_IN_A_TRACE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
