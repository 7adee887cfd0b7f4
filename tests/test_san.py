"""``SanBoard`` (our SAN -> UCI resolver) against python-chess's ``parse_san`` + ``push``.

For every tested position and SAN string, both must give the same UCI move, or raise the same
error class (IllegalMoveError / InvalidMoveError / AmbiguousMoveError), and after every played
move both boards must hold the same position. Positions come from the bundled real games, from
seeded random games biased towards captures, promotions, castling and en passant, and from
hand-made FENs for pins and castling edge cases; SAN strings are every legal move's SAN plus
mutations: pseudo-legal but illegal moves (pins, moving into or staying in check, castling
through check), dropped/added disambiguation, wrong pieces, targets and promotions.
"""

from __future__ import annotations

import collections
import io
import pathlib
import random

import chess
import chess.pgn
import pytest
import zstandard

from allie_jax.san import SanBoard

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = (
    REPO / "data" / "sample" / "lichess_sample.pgn.zst",
    REPO / "data" / "sample" / "lichess_arenas_sample_noclk.pgn.zst",
)
SHARED = REPO.parent / "shared" / "data"  # the project's shared folder beside the checkout

_LETTERS = {
    chess.PAWN: "",
    chess.KNIGHT: "N",
    chess.BISHOP: "B",
    chess.ROOK: "R",
    chess.QUEEN: "Q",
    chess.KING: "K",
}
_CODES = {p: i for i, p in enumerate(".PNBRQK")}


def _outcome_reference(board: chess.Board, san: str) -> str:
    try:
        return board.parse_san(san).uci()
    except ValueError as e:
        return type(e).__name__


def _outcome_ours(ours: SanBoard, san: str) -> str:
    try:
        return ours.copy().push_san(san)
    except ValueError as e:
        return type(e).__name__


def _assert_same_position(ours: SanBoard, board: chess.Board) -> None:
    expected = [0] * 64
    for sq, piece in board.piece_map().items():
        expected[sq] = _CODES[piece.symbol().upper()] | (0 if piece.color else 8)
    assert ours.board == expected, board.fen()
    assert ours.turn == (0 if board.turn else 1)
    assert ours.kings == [board.king(chess.WHITE), board.king(chess.BLACK)]
    assert ours.in_check == board.is_check(), board.fen()
    rights = (
        board.has_kingside_castling_rights(chess.WHITE)
        | board.has_queenside_castling_rights(chess.WHITE) << 1
        | board.has_kingside_castling_rights(chess.BLACK) << 2
        | board.has_queenside_castling_rights(chess.BLACK) << 3
    )
    assert ours.rights == rights, board.fen()
    assert ours.ep == (board.ep_square if board.ep_square is not None else -1), board.fen()


def _plain_san(board: chess.Board, move: chess.Move, *, full: bool = False) -> str:
    """SAN-like text for any pseudo-legal move (board.san() wants legal ones)."""
    piece = board.piece_type_at(move.from_square)
    to = chess.square_name(move.to_square)
    promo = "=" + chess.piece_symbol(move.promotion).upper() if move.promotion else ""
    if piece == chess.PAWN:
        if chess.square_file(move.from_square) != chess.square_file(move.to_square):
            return chess.FILE_NAMES[chess.square_file(move.from_square)] + "x" + to + promo
        return (chess.square_name(move.from_square) if full else "") + to + promo
    src = chess.square_name(move.from_square) if full else ""
    return _LETTERS[piece] + src + to + promo


def _mutations(board: chess.Board, rng: random.Random, legal_sans: list[str]):
    """SAN strings python-chess may accept or reject, aimed at every rule of ``parse_san``."""
    unsafe = set()  # pseudo-legal moves that leave the king in check: pins, checks, castling
    for move in board.pseudo_legal_moves:
        if not board.is_legal(move):
            unsafe.add(_plain_san(board, move))
            unsafe.add(_plain_san(board, move, full=True))
    out = {"O-O", "O-O-O", "0-0", "0-0-0+", "Kg1", "Kc1", "Kg8", "Kc8", "Ke1g1", "Ke8c8"}
    for move in rng.sample(list(board.legal_moves), min(3, len(legal_sans))):
        out.add(_plain_san(board, move, full=True))  # long forms ("Ng1f3", "e2e4")
    for san in rng.sample(legal_sans, min(5, len(legal_sans))):
        core = san.rstrip("+#")
        out.add(core.replace("x", ""))  # python-chess ignores a missing capture mark
        if core[0] in "NBRQK" and len(core) > 3:
            out.add(core[0] + core[-2:])  # drop disambiguation: may become ambiguous
        sq = rng.choice(chess.SQUARE_NAMES)
        out.add(core[:-2] + sq if "=" not in core else core)  # another target
        out.add(rng.choice("NBRQK") + core.lstrip("NBRQK"))  # another piece
        if "=" in core:
            out.add(core.split("=")[0])  # promotion left out
            out.add(core.replace("=", ""))  # "e8Q"
            out.add(core[:-1] + core[-1].lower())  # "e8=q"
            out.add(core[:-1] + "K")  # promotion to a king
        else:
            out.add(core + "=Q")
    for _ in range(4):
        piece = rng.choice(["", "N", "B", "R", "Q", "K"])
        src = rng.choice(["", rng.choice("abcdefgh"), rng.choice("12345678")])
        promo = rng.choice(["", "", "=Q", "=N"])
        out.add(piece + src + rng.choice(["", "x"]) + rng.choice(chess.SQUARE_NAMES) + promo)
    unsafe_part = rng.sample(sorted(unsafe), min(10, len(unsafe)))
    rest = rng.sample(sorted(out), min(25 - len(unsafe_part), len(out)))
    return unsafe_part, rest


def _check_position(
    board: chess.Board, ours: SanBoard, rng: random.Random, counts: collections.Counter
) -> None:
    legal = list(board.legal_moves)
    sans = [board.san(m) for m in legal]
    for move, san in zip(legal, sans, strict=True):
        assert _outcome_ours(ours, san) == move.uci(), (board.fen(), san)
        counts["legal_san"] += 1
        counts["ep"] += board.is_en_passant(move)
        counts["castling"] += board.is_castling(move)
        counts["promotion"] += move.promotion is not None
    unsafe, other = _mutations(board, rng, sans)
    for i, san in enumerate(unsafe + other):
        expected = _outcome_reference(board, san)
        assert _outcome_ours(ours, san) == expected, (board.fen(), san)
        counts[expected if not expected[0].islower() else "mutated_legal"] += 1
        counts["unsafe_rejected"] += i < len(unsafe) and expected == "IllegalMoveError"
    counts["in_check"] += board.is_check()
    counts["pinned"] += any(
        board.is_pinned(board.turn, sq) for sq in chess.SquareSet(board.occupied_co[board.turn])
    )


def _play_both(board: chess.Board, ours: SanBoard, move: chess.Move) -> None:
    assert ours.push_san(board.san(move)) == move.uci(), (board.fen(), move)
    board.push(move)
    _assert_same_position(ours, board)


def _biased_choice(board: chess.Board, legal: list[chess.Move], rng: random.Random):
    """A random legal move, favouring en passant, promotions, castling, double pushes, captures."""
    rare = [m for m in legal if m.promotion or board.is_en_passant(m) or board.is_castling(m)]
    if rare and rng.random() < 0.8:
        return rng.choice(rare)
    pawns = [
        m for m in legal if board.piece_type_at(m.from_square) == chess.PAWN or board.is_capture(m)
    ]
    if pawns and rng.random() < 0.5:
        return rng.choice(pawns)
    return rng.choice(legal)


def _random_games(seed: int, games: int, check_every: int) -> collections.Counter:
    rng = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    for _ in range(games):
        board, ours = chess.Board(), SanBoard()
        for ply in range(rng.randrange(40, 300)):
            legal = list(board.legal_moves)
            if not legal:
                break
            if ply % check_every == 0:
                _check_position(board, ours, rng, counts)
            _play_both(board, ours, _biased_choice(board, legal, rng))
            counts["positions"] += 1
    return counts


def test_random_games_every_legal_and_mutated_san():
    counts = _random_games(seed=0, games=12, check_every=2)
    # The random games must really reach the hard cases (or the test proves little).
    assert counts["positions"] > 1500 and counts["promotion"] >= 30
    assert counts["in_check"] >= 20 and counts["unsafe_rejected"] >= 500
    assert counts["IllegalMoveError"] > 5000 and counts["AmbiguousMoveError"] >= 20
    assert counts["mutated_legal"] > 1000


@pytest.mark.slow
def test_random_games_long():
    counts = _random_games(seed=1, games=400, check_every=1)
    assert counts["positions"] > 40_000 and counts["ep"] >= 50 and counts["castling"] >= 50


def _pgn_games(path: pathlib.Path, limit: int | None = None):
    with open(path, "rb") as f:
        text = zstandard.ZstdDecompressor().stream_reader(f).read().decode()
    stream = io.StringIO(text)
    n = 0
    while (game := chess.pgn.read_game(stream)) is not None and (limit is None or n < limit):
        n += 1
        yield game


def _replay_real(games, rng: random.Random, check_every: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for game in games:
        board, ours = chess.Board(), SanBoard()
        for move in game.mainline_moves():
            if check_every and counts["plies"] % check_every == 0:
                _check_position(board, ours, rng, counts)
            _play_both(board, ours, move)
            counts["plies"] += 1
    return counts


def test_real_games_every_move():
    """Every move of the bundled games; all legal and mutated SAN every 101st position."""
    rng = random.Random(0)
    counts = _replay_real(_pgn_games(SAMPLES[0]), rng, check_every=101)
    counts.update(_replay_real(_pgn_games(SAMPLES[1], limit=500), rng, check_every=101))
    assert counts["plies"] > 90_000 and counts["castling"] >= 50 and counts["pinned"] >= 50
    assert counts["in_check"] >= 20 and counts["unsafe_rejected"] >= 300


@pytest.mark.slow
@pytest.mark.skipif(
    not SHARED.exists(), reason="needs the shared data folder beside the checkout (../shared/data)"
)
def test_all_shared_games_every_move():
    """All 18,037 games of ../shared/data move by move; SAN mutations every 25th position."""
    counts: collections.Counter = collections.Counter()
    for path in sorted(SHARED.glob("*/*.pgn.zst")):
        counts.update(_replay_real(_pgn_games(path), random.Random(0), check_every=25))
    assert counts["plies"] > 1_000_000 and counts["ep"] >= 50


@pytest.mark.parametrize(
    "fen,san,expected",
    [
        # En passant that would expose the king along the rank (both pawns leave it).
        ("8/8/8/K2pP2r/8/8/8/7k w - d6 0 1", "exd6", "IllegalMoveError"),
        ("8/8/8/K2pP3/8/8/8/7k w - d6 0 1", "exd6", "e5d6"),
        # En passant out of a check given by the pawn that just moved.
        ("8/8/8/2kpP3/8/8/8/4K3 w - d6 0 1", "exd6", "e5d6"),
        # A pinned knight cannot move; the other knight then is the only one.
        ("4k3/8/8/8/4r3/8/4N3/2N1K3 w - - 0 1", "Nd4", "IllegalMoveError"),
        ("4k3/8/8/8/4r3/8/4N3/2N1K3 w - - 0 1", "Nb3", "c1b3"),
        ("4k3/8/8/8/4r3/8/4N3/2N1K3 w - - 0 1", "Nd3", "c1d3"),
        ("4k3/8/8/8/4r3/8/4N3/2N1K3 w - - 0 1", "Ncd3", "c1d3"),
        ("4k3/8/8/8/4r3/8/4N3/2N1K3 w - - 0 1", "Ned3", "IllegalMoveError"),
        # Two knights can reach d2 and neither is pinned: ambiguous.
        ("4k3/8/8/8/8/8/8/1N2KN2 w - - 0 1", "Nd2", "AmbiguousMoveError"),
        # A pinned bishop may move along the pin, up to and including the pinner.
        ("4k3/8/8/8/q7/8/2B5/3K4 w - - 0 1", "Bb3", "c2b3"),
        ("4k3/8/8/8/q7/8/2B5/3K4 w - - 0 1", "Bxa4", "c2a4"),
        ("4k3/8/8/8/q7/8/2B5/3K4 w - - 0 1", "Bd3", "IllegalMoveError"),
        # The king may not step back along the checking ray.
        ("4k3/8/8/8/4r3/8/8/4K3 w - - 0 1", "Ke1", "IllegalMoveError"),
        ("4k3/4r3/8/8/8/8/4K3/8 w - - 0 1", "Ke1", "IllegalMoveError"),
        ("4k3/4r3/8/8/8/8/4K3/8 w - - 0 1", "Kd1", "e2d1"),
        # Castling: through an attacked square, out of check, path blocked, rights lost, spelt
        # as the king's move (python-chess takes only the "e1g1" form).
        ("4k3/8/8/8/8/8/5r2/R3K2R w KQ - 0 1", "O-O", "IllegalMoveError"),
        ("4k3/8/8/8/8/8/5r2/R3K2R w KQ - 0 1", "O-O-O", "e1c1"),
        ("4k3/8/8/8/8/8/8/R3K2R w KQ - 0 1", "Kg1", "IllegalMoveError"),
        ("4k3/8/8/8/8/8/8/R3K2R w KQ - 0 1", "Ke1g1", "IllegalMoveError"),
        ("4k3/8/8/8/8/8/8/R3K2R w KQ - 0 1", "e1g1", "e1g1"),
        ("4k3/8/8/8/8/8/8/R3K2R w KQ - 0 1", "0-0-0+", "e1c1"),
        ("4k3/8/8/8/4r3/8/8/R3K2R w KQ - 0 1", "O-O", "IllegalMoveError"),
        ("4k3/8/8/8/8/8/8/RN2K2R w KQ - 0 1", "O-O-O", "IllegalMoveError"),
        ("4k3/8/8/8/8/8/8/R3K2R w K - 0 1", "O-O-O", "IllegalMoveError"),
        ("4k3/8/8/8/8/8/1r6/R3K2R w KQ - 0 1", "O-O-O", "e1c1"),  # b1 attacked: irrelevant
        # Promotions: every spelling python-chess accepts, and the ones it rejects.
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "e8=Q", "e7e8q"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "e8N+", "e7e8n"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "exd8=r", "e7d8r"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "e8", "IllegalMoveError"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "e8=K", "IllegalMoveError"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "Ka2=Q", "IllegalMoveError"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "e7e8=Q", "e7e8q"),
        # Syntax python-chess refuses, and an own piece on the target.
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "Zz9", "InvalidMoveError"),
        ("3r3k/4P3/8/8/8/8/8/K7 w - - 0 1", "e9", "InvalidMoveError"),
        ("4k3/8/8/8/8/8/4P3/4K3 w - - 0 1", "Ke2", "IllegalMoveError"),
        # A capture mark on a quiet move and none on a capture are both accepted.
        ("4k3/8/8/3p4/4P3/8/8/4K3 w - - 0 1", "ed5", "e4d5"),
        ("4k3/8/8/3p4/4P3/8/8/4K3 w - - 0 1", "Kxd2", "e1d2"),
    ],
)
def test_hand_made_positions(fen, san, expected):
    board = chess.Board(fen)
    assert _outcome_reference(board, san) == expected  # the reference itself, as a check
    ours = SanBoard.from_fen(fen)
    assert _outcome_ours(ours, san) == expected
    if not expected.endswith("Error"):
        ours.push_san(san)
        board.push(board.parse_san(san))
        _assert_same_position(ours, board)


def test_fallback_replays_history():
    """A move only python-chess reads ("e1g1" castling) is played on our board too."""
    ours, board = SanBoard(), chess.Board()
    for san in ("e4", "e5", "Nf3", "Nc6", "Bc4", "Bc5", "e1g1", "Nf6", "d3", "O-O"):
        assert ours.push_san(san) == board.push_san(san).uci()
        _assert_same_position(ours, board)
    assert ours.history[6] == "e1g1"
