"""The evaluator end to end (launch.evaluate on a tiny checkpoint and real games) and its pieces on
crafted inputs with hand-computed answers."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import subprocess
import sys

import chess
import chess.pgn
import numpy as np
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.eval import records, summarize
from allie_jax.eval.positions import game_positions
from allie_jax.eval.scoring import CausalScorer, PositionOutputs, score_per_prefix
from allie_jax.eval.summarize import Columns
from allie_jax.eval.systems import Scores
from allie_jax.eval.tally import Tally
from allie_jax.game import Game, encode_game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import open_text, read_games
from tests.support.stockfish_support import require_stockfish

# the package re-exports the function ``evaluate``, which shadows the module's name
ev = importlib.import_module("allie_jax.eval.evaluate")

REPO_KEYS = ("move_accuracy", "legal", "think_time", "resign", "value", "meta")


@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def checkpoint(tiny_model, tmp_path_factory):
    from allie_jax.model.checkpoint import save_model

    return save_model(tiny_model, tmp_path_factory.mktemp("ckpt") / "model")


@pytest.fixture(scope="module")
def sample_games(sample_pgn):
    games = []
    for g in read_games(sample_pgn):
        games.append(g)
        if len(games) == 6:
            break
    return games


def _uci_game(sans: str, **kw) -> Game:
    board = chess.Board()
    moves = []
    for san in sans.split():
        move = board.parse_san(san)
        moves.append(move.uci())
        board.push(move)
    return Game(moves=moves, **kw)


# ------------------------------------------------------------------ crafted inputs, hand answers


def _outputs_for(gp, rows_logits, value_white, time_s=None) -> PositionOutputs:
    logits = np.asarray(rows_logits, np.float64)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    k = len(logits)
    return PositionOutputs(
        logp.astype(np.float32),
        np.asarray(value_white, np.float32),
        np.zeros(k, np.float32) if time_s is None else np.asarray(time_s, np.float32),
    )


def test_reduce_outputs_crafted():
    game = _uci_game("e4 e5", result=-1.0, termination="Normal")
    gp = game_positions(game)
    logits = np.zeros((3, vocab.VOCAB_SIZE))
    e2e4, e7e5, g1f3 = (vocab.MOVE_TO_ID[m] for m in ("e2e4", "e7e5", "g1f3"))
    logits[0, vocab.MOVE_TO_ID["e2e5"]] = 9.0  # illegal, top token: not the prediction
    logits[0, e2e4] = 5.0
    logits[1, e7e5] = 5.0
    logits[2, g1f3] = 2.0
    logits[2, vocab.TERMINATION] = 4.0  # beats every legal move at the final board
    # White to move at the final board with value −0.95 (White's view): resigns; position 1 has
    # Black to move and White's value +0.95 -> Black's −0.95, but its termination logit is 0
    r = ev.reduce_outputs(_outputs_for(gp, logits, [0.0, 0.95, -0.95]), gp)
    assert list(r.pred) == [e2e4, e7e5, g1f3]
    assert list(r.top_legal) == [False, True, True]
    assert list(r.resign) == [False, False, True]
    # 20 legal moves at the start; the other 1,948 move tokens are illegal: e2e5 (logit 9) and
    # 1,947 at logit 0. Normaliser: e^9 + e^5 + the 1,995 other tokens at logit 0.
    z = math.exp(9) + math.exp(5) + vocab.VOCAB_SIZE - 2
    assert r.invalid_mass[0] == pytest.approx((math.exp(9) + 1947) / z, rel=1e-5)


def _result(pred, resign, value, time_s=None, top_legal=None, invalid=None) -> Scores:
    """Crafted per-position scores of the policy for one game (every position scored)."""
    k = len(pred)
    sc = Scores.empty(k)
    sc.scored[:] = True
    sc.top_moves[:, 0] = pred
    sc.top_legal[:] = True if top_legal is None else np.asarray(top_legal, bool)
    sc.invalid_mass[:] = 0.0 if invalid is None else np.asarray(invalid, float)
    sc.resign[:] = np.asarray(resign, bool)
    sc.value[:] = np.asarray(value, np.float32)
    sc.think_time[:] = 0.0 if time_s is None else np.asarray(time_s, np.float32)
    return sc


def _report(games, results) -> dict:
    """The report of crafted games and policy scores, through the records and the tally."""
    table = _columns(games, results).table
    spec = summarize.Spec(["policy"], min_ply=10, min_clock=30.0)
    tally = Tally()
    summarize.reduce_human(tally, table, spec)
    job = {"config": {"seed": 0, "min_ply": 10, "min_clock": 30.0}, "systems": ["policy"],
           "checkpoint": None, "games_file": None}  # fmt: skip
    return summarize.report_from_tally(tally, [{"job": job, "chunks": []}], spec)


def _columns(games, results) -> Columns:
    """The records of crafted games and policy scores, read back as the report reads them."""
    for i, g in enumerate(games):
        g.game_id = g.game_id or f"g{i}"
    gps = [game_positions(g) for g in games]
    pos = ev._all_positions(games, gps, 0)
    scores = Scores.empty(len(pos))
    offset = 0
    for r in results:
        scores = _merge(scores, r, offset)
        offset += len(r)
    assert offset == len(pos)
    return Columns(records.chunk_table(pos, {"policy": scores}))


def _merge(into: Scores, part: Scores, offset: int) -> Scores:
    rows = np.arange(offset, offset + len(part))
    placed = part.scatter(rows, len(into))
    keep = placed.scored
    for f in dataclasses.fields(Scores):
        getattr(into, f.name)[keep] = getattr(placed, f.name)[keep]
    return into


def test_resign_block_crafted():
    games = [
        _uci_game("e4 e5", result=-1.0, termination="Normal"),  # resigned, loser to move
        _uci_game("d4 d5", result=0.0, termination="Normal"),
        _uci_game("c4 c5", result=1.0, termination="Normal"),  # resigned, winner to move
    ]
    results = [
        _result([0, 0, 0], [False, True, True], [0, 0, -1]),  # TP at the final board, FP at ply 1
        _result([0, 0, 0], [False, False, False], [0, 0, 0]),  # 3 negatives
        _result([0, 0, 0], [False, False, True], [0, 0, 0]),  # final board: counted nowhere
    ]
    out = _report(games, results)["resign"]
    assert out["tpr"]["value"] == 1.0 and out["tpr"]["n"] == 1
    # negatives: plies 0, 1 of each game (6) + the drawn game's final board = 7, one positive
    assert out["fpr"]["n"] == 7 and out["fpr"]["successes"] == 1
    assert out["resigned_games"] == 2 and out["resigned_games_winner_to_move"] == 1


def test_value_think_time_legal_blocks_crafted():
    g1 = _uci_game("e4 e5", result=1.0, think_times=[1.0, 70.0])
    g2 = _uci_game("d4 d5", result=-1.0, think_times=[3.0, -1.0])
    r1 = _result([0, 0, 0], [0, 0, 0], [0.2, 0.4, 0.9], time_s=[2.0, 9.0, 0.0],
                 top_legal=[1, 0, 1], invalid=[0.1, 0.3, 0.0])  # fmt: skip
    r2 = _result([0, 0, 0], [0, 0, 0], [-0.2, -0.6, -0.5], time_s=[4.0, 0.0, 0.0],
                 top_legal=[1, 1, 1], invalid=[0.2, 0.0, 0.0])  # fmt: skip
    report = _report([g1, g2], [r1, r2])
    value = report["value"]
    # deciles of plies 0, 1, 2 in 2-move games: 0, 5, 9 (the final board is the last decile)
    groups = {row["group"]: row for row in value["by_progress"]}
    assert groups[0]["r"] == pytest.approx(1.0) and groups[0]["n"] == 2
    assert groups[3]["n"] == 0 and math.isnan(groups[3]["r"])
    assert value["positions"] == 6
    tt = report["think_time"]
    # labelled: (pred 2, human 1), (9, 70 -> clipped 60), (4, 3); unlabelled −1 dropped
    assert tt["positions"] == 3
    x, y = np.array([2.0, 9.0, 4.0]), np.array([1.0, 60.0, 3.0])
    assert tt["pearson_r"]["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert tt["pearson_r"]["games"] == 2  # its interval resamples the two games, not 3 positions
    assert value["overall"]["games"] == 2 and value["overall"]["n"] == 6
    legal = report["legal"]["human"]  # the final boards are not scored
    assert legal["all"]["top_legal"]["successes"] == 3 and legal["all"]["top_legal"]["n"] == 4
    assert legal["all"]["invalid_mass"]["value"] == pytest.approx(0.15)
    assert legal["check"]["top_legal"]["n"] == 0


# ------------------------------------------------------------------ model-backed checks


def test_causal_pass_matches_per_prefix_and_direct_call(tiny_model, sample_games):
    scorer = CausalScorer(tiny_model, batch_size=4)
    games = sample_games[:3]
    one = dict(scorer.score(games))
    ref = dict(score_per_prefix(scorer, games))
    for i, g in enumerate(games):
        assert one[i].log_probs.shape == (len(g.moves) + 1, vocab.VOCAB_SIZE)
        np.testing.assert_allclose(one[i].log_probs, ref[i].log_probs, atol=2e-4)
        np.testing.assert_allclose(one[i].value_white, ref[i].value_white, atol=1e-5)
    # an independent reference: the model called directly on one game's partial tokens
    enc = encode_game(games[0], partial=True)
    out = tiny_model(enc.tokens[None])
    logits = np.asarray(out.policy_logits[0, enc.header_len - 1 :])
    logp = logits - np.log(np.exp(logits.astype(np.float64)).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(one[0].log_probs, logp, atol=2e-4)


def _independent_positions(pgn_path, max_games: int, keep=lambda headers: True) -> int:
    """Count move-matching positions straight from the PGN with python-chess (no allie code),
    in the games whose headers pass ``keep``."""
    count = 0
    with open_text(pgn_path) as f:
        games_seen = 0
        while games_seen < max_games and (game := chess.pgn.read_game(f)) is not None:
            nodes = list(game.mainline())
            if not nodes:
                continue
            games_seen += 1
            if not keep(game.headers):
                continue
            base = float(game.headers["TimeControl"].split("+")[0])
            clocks = [n.clock() for n in nodes]
            for i in range(len(nodes)):
                before = base if i < 2 else clocks[i - 2]
                if i >= 10 and not (before is not None and before < 30):
                    count += 1
    return count


def test_launch_evaluate_command(checkpoint, sample_pgn, tmp_path):
    out = tmp_path / "report"
    cmd = [
        sys.executable, "-m", "launch.evaluate", f"--checkpoint={checkpoint}",
        f"--games={sample_pgn}", f"--output={out}", "--systems=policy,greedy",
        "--max_games=8", "--random_games=3", f"--compile_cache={tmp_path / 'jax-cache'}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any((tmp_path / "jax-cache").iterdir())  # compiled programs kept for the next run
    report = json.loads((out / "report.json").read_text())
    for key in REPO_KEYS:
        assert key in report
    for system in ("policy", "greedy"):
        block = report["move_accuracy"][system]
        assert set(block) >= {"overall", "by_elo", "special", "positions"}
        assert set(block["special"]) == {"castling", "en_passant", "promotion", "threefold"}
        assert block["positions"] == _independent_positions(sample_pgn, 8)
        assert 0.0 <= block["overall"]["value"] <= 1.0
        lo, hi = block["overall"]["ci95"]
        assert lo <= block["overall"]["value"] <= hi
    assert set(report["legal"]) >= {"human", "random"}
    assert set(report["legal"]["human"]) == {"all", "check"}
    assert set(report["think_time"]) >= {"pearson_r", "by_human_time"}
    assert set(report["resign"]) >= {"tpr", "fpr"}
    assert len(report["value"]["by_progress"]) == 10
    md = (out / "report.md").read_text()
    assert "## Move-matching accuracy" in md and "| policy |" in md
    for png in ("accuracy_vs_elo.png", "think_time.png", "value_by_progress.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"

    # the report rebuilt from the records alone is the direct run's report, byte for byte
    again = tmp_path / "again"
    cmd = [sys.executable, "-m", "launch.evaluate", f"--report_only={out / 'records'}"]
    proc = subprocess.run([*cmd, f"--output={again}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (again / "report.json").read_text() == (out / "report.json").read_text()
    assert (again / "report.md").read_text() == (out / "report.md").read_text()
    # a slice: only the positions of games whose White is rated 2000+, counted independently
    sliced = tmp_path / "sliced"
    part = ev.report_from_records(out / "records", sliced, filter="white_elo >= 2000")
    want = _independent_positions(sample_pgn, 8, lambda h: int(h["WhiteElo"]) >= 2000)
    assert 0 < want < report["move_accuracy"]["policy"]["positions"]
    assert part["move_accuracy"]["policy"]["positions"] == want
    assert part["meta"]["filter"] == "white_elo >= 2000"


def test_evaluate_rejects_bad_systems():
    with pytest.raises(ValueError, match="systems"):
        ev.EvalConfig(systems=("policy", "nonesuch"))


@pytest.mark.slow
def test_evaluate_search_systems_and_stockfish(tiny_model, sample_pgn, tmp_path):
    cfg = ev.EvalConfig(
        systems=("policy", "search", "adaptive"),
        max_games=6,
        search_positions=8,
        search_batch_size=4,
        random_games=2,
        stockfish=require_stockfish(),
        stockfish_positions=10,
        stockfish_nodes=2000,
        progress=False,
    )
    report = ev.evaluate(tiny_model, sample_pgn, tmp_path, cfg)
    for mode in ("search", "adaptive"):
        block = report["move_accuracy"][mode]
        assert block["positions"] == 8 and block["subsample"]
        assert block["mean_sims"] > 0
    assert report["value"]["stockfish"]["positions"] == 10


@pytest.mark.slow
def test_search_positions_all_with_the_real_searcher(tiny_model, sample_pgn, tmp_path):
    """Every protocol position of two games through ``adaptive``, batched across the games; the
    records' top move is the argmax of ``Searcher.run`` called directly on the same prefix."""
    from allie_jax.eval import records
    from allie_jax.search import SearchConfig, Searcher

    cfg = ev.EvalConfig(
        systems=("policy", "adaptive"), max_games=2, search_positions="all",
        search_batch_size=16, random_games=0, progress=False, plots=False,
    )  # fmt: skip
    report = ev.evaluate(tiny_model, sample_pgn, tmp_path, cfg)
    acc = report["move_accuracy"]
    assert acc["adaptive"]["positions"] == acc["policy"]["positions"] > 16
    assert acc["adaptive"]["mean_sims"] > 0 and "policy" in acc["adaptive"]["paired"]
    t = records.load_records(tmp_path).human
    rows = [r for r in t.to_pylist() if r["adaptive.scored"]][:3]
    games = {
        g.game_id: g for g in read_games(sample_pgn) if g.game_id in {r["game_id"] for r in rows}
    }
    searcher = Searcher(tiny_model, SearchConfig.preset("adaptive"))
    for r in rows:
        g = games[r["game_id"]]
        prefix = Game(moves=g.moves[: r["ply"]], white_elo=g.white_elo, black_elo=g.black_elo,
                      time_control=g.time_control, game_id=g.game_id)  # fmt: skip
        out = searcher.run([prefix], 0)
        assert r["adaptive.top_moves"][0] == vocab.decode_move(int(out.policy[0].argmax()))
        assert r["adaptive.num_sims"] == int(out.num_sims[0])
