"""FEN starts: a history from the standard start that python-chess agrees reaches the FEN."""

from __future__ import annotations

import io
import pathlib
import random

import chess
import chess.pgn
import pytest
import zstandard

from allie_jax.engine import fen_history

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sample" / "lichess_sample.pgn.zst"


def real_positions(n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """``n`` positions from real games at plies 4-16: (FEN, the game's real moves to it)."""
    with SAMPLE.open("rb") as f:
        text = zstandard.ZstdDecompressor().stream_reader(f).read().decode()
    pgn = io.StringIO(text)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        game = chess.pgn.read_game(pgn)
        if game is None:
            break
        moves = list(game.mainline_moves())
        if len(moves) < 17:
            continue
        ply = rng.randint(4, 16)
        board = chess.Board()
        for m in moves[:ply]:
            board.push(m)
        out.append((board.fen(), [m.uci() for m in moves[:ply]]))
    assert len(out) == n
    return out


def same_position(a: chess.Board, b: chess.Board) -> bool:
    """Pieces, side to move, castling rights and a usable en-passant square, as FIDE's
    repetition rule counts them (python-chess's own reading of both boards)."""
    ep = [x.ep_square if x.has_legal_en_passant() else None for x in (a, b)]
    return (
        a.board_fen() == b.board_fen()
        and a.turn == b.turn
        and a.castling_rights == b.castling_rights
        and ep[0] == ep[1]
    )


def check(positions, min_found: float) -> int:
    found = 0
    for fen, _real in positions:
        h = fen_history.find_history(fen, time_limit_s=5.0)
        if h.found:
            board = chess.Board()
            for uci in h.moves:
                move = chess.Move.from_uci(uci)
                assert move in board.legal_moves, (fen, h.moves)
                board.push(move)
            assert same_position(board, chess.Board(fen)), (fen, h.moves)
            found += 1
        else:
            assert h.why, fen  # the engine says why not
    assert found >= min_found * len(positions), (found, len(positions))
    return found


def test_histories_of_real_opening_positions_reach_them_exactly():
    check(real_positions(8, seed=3), min_found=0.5)


@pytest.mark.slow
def test_200_real_positions():
    """Every found history reaches its board exactly, and every miss has a reason."""
    check(real_positions(200, seed=0), min_found=0.5)


def test_start_unreachable_and_invalid_fens():
    assert fen_history.find_history(chess.STARTING_FEN).moves == ()
    after = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    assert fen_history.find_history(after).moves == ("e2e4",)
    far = fen_history.find_history("8/8/8/8/8/4k3/8/4K2R w K - 0 1")
    assert not far.found and "plies" in far.why
    with pytest.raises(ValueError, match="not a fen"):
        fen_history.find_history("not a fen")
