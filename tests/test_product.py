"""The whole product, every family × every mode it supports, the way users reach it.

Families: the Allie decoder (a tiny random-init checkpoint: the path, not the strength, is under
test), the board transformer (``board_tiny``) and Maia-1 (the real lc0 nets, skipped with the
reason when absent). Front ends: the Python API (``Allie.load(...).play``, ``MaiaEngine.play``),
``launch.uci`` (a real engine process per family, every mode through ``setoption name Mode``),
``launch.evaluate --systems`` (one job scoring every system name) and ``launch.match``.

What would be wrong without an error, and is checked here against python-chess or the model's own
direct forward pass rather than against the search's output: an illegal or junk move; ``greedy``
not being the policy's argmax (checked against ``predict``, one forward); a search mode that did
not search (``path`` and ``sims``); a mode a family cannot play being played as another (it must
be refused, naming the mode); a system name the evaluator accepts but a family cannot score.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys

import chess
import chess.pgn
import numpy as np
import pytest
from flax import nnx

from allie_jax.game import Game
from allie_jax.pgn import read_games
from allie_jax.search.config import MODES
from tests.support.maia_support import maia_dir

REPO = pathlib.Path(__file__).resolve().parents[1]

# What each family can play, written out here (not read from the code under test): the decoder
# has a think-time head, so it has the adaptive modes; the board family and Maia do not.
FAMILY_MODES = {
    "allie": ("policy", "greedy", "search", "adaptive", "gumbel", "gumbel-adaptive"),
    "board": ("policy", "greedy", "search", "gumbel"),
    "maia": ("policy", "greedy", "search", "gumbel"),
}
SEARCHING = ("search", "adaptive", "gumbel", "gumbel-adaptive")
CHEAP = {"mean_sims": 8, "max_sims": 16}


def test_the_mode_table_covers_every_mode():
    assert set(FAMILY_MODES["allie"]) == set(MODES)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """A saved checkpoint per trainable family, as ``launch.train`` would leave one."""
    from allie_jax.model import AllieModel, ModelConfig
    from allie_jax.model.board_transformer import BoardConfig, BoardTransformer
    from allie_jax.model.checkpoint import save_model

    root = tmp_path_factory.mktemp("product")
    allie = save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), root / "allie")
    board = BoardTransformer(BoardConfig.named("board_tiny", num_layers=2), rngs=nnx.Rngs(7))
    return {"allie": str(allie), "board": str(save_model(board, root / "board"))}


@pytest.fixture(scope="module")
def games(sample_pgn) -> list[Game]:
    """Two real games in progress (one with White, one with Black to move)."""
    out = []
    for i, g in enumerate(itertools.islice(read_games(sample_pgn), 2)):
        cut = 10 + i
        out.append(Game(g.moves[:cut], g.white_elo, g.black_elo, g.time_control))
    return out


def _board(game: Game) -> chess.Board:
    board = chess.Board()
    for uci in game.moves:
        board.push_uci(uci)
    return board


_PLAYERS: dict[str, object] = {}  # one player per family for the module (compiled once)


def _player(family: str, checkpoints):
    if family not in _PLAYERS:
        if family == "maia":
            from allie_jax.baselines.maia_player import MaiaEngine

            _PLAYERS[family] = MaiaEngine(str(maia_dir()))
        else:
            from allie_jax.engine.api import Allie

            _PLAYERS[family] = Allie.load(checkpoints[family])
    return _PLAYERS[family]


# ---------------------------------------------------------------- the Python API


def _entries(default_only: bool) -> list:
    """Every (family, mode) pair; the default suite plays a few of them (each mode compiles its
    own programs, minutes for the whole table on a 2-core CI box), ``make test-all`` the rest."""
    out = []
    for family, modes in FAMILY_MODES.items():
        for mode in modes:
            default = (family, mode) in SMOKE
            if default or not default_only:
                marks = () if default else (pytest.mark.slow,)
                out.append(pytest.param(family, mode, marks=marks, id=f"{family}-{mode}"))
    return out


# the pairs the default suite plays: every family's direct policy path and one search each
SMOKE = {("allie", "policy"), ("allie", "adaptive"), ("board", "search"), ("maia", "gumbel")}


@pytest.mark.parametrize(("family", "mode"), _entries(default_only=False))
def test_python_api_plays_every_mode(family, mode, checkpoints, games):
    from allie_jax.player import Player

    player = _player(family, checkpoints)
    assert isinstance(player, Player)
    decisions = player.play(games, mode, 3, **CHEAP)
    assert len(decisions) == len(games), mode
    for game, d in zip(games, decisions, strict=True):
        board = _board(game)
        assert chess.Move.from_uci(d.move) in board.legal_moves, (family, mode, d.move)
        if mode in SEARCHING:
            assert d.path == "search" and d.sims > 0, (family, mode, d.path, d.sims)
            assert d.visits and set(d.visits) <= {m.uci() for m in board.legal_moves}
        else:
            assert d.sims == 0 and d.path == "prior", (family, mode, d.path, d.sims)


@pytest.mark.parametrize("family", ["allie", "board"])
def test_greedy_is_the_direct_policy_argmax(family, checkpoints, games):
    """``greedy`` plays what one forward pass ranks first (``predict``: no search code)."""
    player = _player(family, checkpoints)
    direct = player.predict(games)
    for game, pred, d in zip(games, direct, player.play(games, "greedy", 0), strict=True):
        best = max(pred.move_probs, key=pred.move_probs.get)
        assert d.move == best, (family, game.moves)


@pytest.mark.parametrize("family", list(FAMILY_MODES))
def test_each_player_lists_the_modes_it_plays(family, checkpoints):
    assert tuple(_player(family, checkpoints).modes) == FAMILY_MODES[family]


@pytest.mark.parametrize("family", ["allie", "board"])
def test_the_browser_page_offers_the_models_modes(family, checkpoints):
    """The page's mode list and default come from the loaded model; a mode it cannot play is a
    400 naming the mode, before any game starts."""
    from allie_jax.engine.web.server import allie_app
    from allie_jax.engine.web.session import RequestError

    app = allie_app(_player(family, checkpoints))
    info = app.info()
    assert tuple(info["modes"]) == FAMILY_MODES[family]
    assert info["defaults"]["mode"] in FAMILY_MODES[family]
    if family == "board":
        with pytest.raises(RequestError, match="adaptive"):
            app.new_game({"mode": "adaptive"})
        assert app.new_game({}).settings.mode == "search"
    else:
        assert app.new_game({}).settings.mode == "adaptive"


@pytest.mark.parametrize("family", ["board", "maia"])
@pytest.mark.parametrize("mode", ["adaptive", "gumbel-adaptive"])
def test_a_mode_the_family_cannot_play_is_refused_by_name(family, mode, checkpoints, games):
    player = _player(family, checkpoints)
    with pytest.raises(ValueError, match=mode):
        player.play(games, mode, 0, **CHEAP)


# ---------------------------------------------------------------- launch.uci


def _uci_session(cmd: list[str], lines: list[str], env: dict) -> tuple[list[str], str, int]:
    """Talk to an engine as a GUI does: after ``isready`` wait for ``readyok``, after ``go`` for
    ``bestmove`` (a GUI never sends the next ``go`` while the engine thinks), then ``quit``."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        text=True,
        bufsize=1,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out: list[str] = []

    def wait_for(prefix: str) -> None:
        while True:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"engine exited waiting for {prefix}: {out[-20:]}")
            out.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return

    try:
        for line in lines:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            if line == "isready":
                wait_for("readyok")
            elif line.startswith("go"):
                wait_for("bestmove")
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        rest, err = proc.communicate(timeout=600)
    except BaseException:
        proc.kill()
        raise
    return out + rest.splitlines(), err, proc.returncode


def _uci_command(family: str, checkpoints) -> list[str]:
    spec = f"maia:{maia_dir()}" if family == "maia" else checkpoints[family]
    return [sys.executable, "-m", "launch.uci", "--checkpoint", spec]


def _modes(family: str, everything: bool) -> tuple[str, ...]:
    return tuple(m for m in FAMILY_MODES[family] if everything or (family, m) in SMOKE)


@pytest.mark.parametrize(
    ("family", "everything"),
    # the default suite: the board family (the decoder and Maia have their own UCI tests in
    # test_uci.py / test_maia_uci.py); make test-all: every family, every mode
    [pytest.param("board", False, id="board-smoke")]
    + [pytest.param(f, True, id=f"{f}-all", marks=pytest.mark.slow) for f in FAMILY_MODES],
)
def test_launch_uci_plays_every_mode(family, everything, checkpoints, games, tmp_path):
    """One engine process per family; each mode set with ``setoption name Mode`` and played from
    a real game's moves with a node limit, so the search runs whatever the machine's load."""
    modes = _modes(family, everything)
    lines = ["uci", "setoption name UCI_ShowWDL value true"]
    for mode in modes:
        lines += [f"setoption name Mode value {mode}", "isready"]
        for game in games:
            lines += [f"position startpos moves {' '.join(game.moves)}", "go nodes 8"]
    env = dict(os.environ, ALLIE_JAX_CACHE_DIR=str(tmp_path / "cache"))
    out, err, code = _uci_session(_uci_command(family, checkpoints), lines, env)
    assert code == 0, err[-3000:]
    stdout = "\n".join(out)
    bestmoves = [ln.split()[1] for ln in out if ln.startswith("bestmove")]
    paths = [ln for ln in out if ln.startswith("info string move ")]
    expected = [(m, g) for m in modes for g in games]
    assert len(bestmoves) == len(expected), (family, stdout[-3000:])
    assert len(paths) == len(expected), (family, stdout[-3000:])
    for (mode, game), move, path in zip(expected, bestmoves, paths, strict=True):
        assert chess.Move.from_uci(move) in _board(game).legal_moves, (family, mode, move)
        want = "search" if mode in SEARCHING else "prior"
        assert f" path {want}" in path, (family, mode, path)
    assert not [ln for ln in out if "error" in ln.lower()], stdout[-3000:]


# ---------------------------------------------------------------- launch.evaluate


def _system_names(everything: bool) -> list[str]:
    """``MODE`` for the decoder checkpoint, ``maia``/``board`` and ``maia+MODE``/``board+MODE``
    (the default suite: the board and Maia systems; the decoder's are in test_evaluate.py)."""
    names = list(_modes("allie", everything)) if everything else ["policy"]
    for family in ("maia", "board"):
        names.append(family)
        names += [f"{family}+{m}" for m in _modes(family, everything) if m in SEARCHING]
    return names


def test_evaluator_names_follow_the_mode_table():
    """A system name is accepted exactly when its family plays the mode (checked before any
    model loads: ``maia+adaptive`` used to pass the name check and fail in the factory)."""
    from allie_jax.eval.systems import check_names

    for family in ("maia", "board"):
        for mode in MODES:
            if mode not in SEARCHING:
                continue
            name = f"{family}+{mode}"
            if mode in FAMILY_MODES[family]:
                check_names([name])
            else:
                with pytest.raises(ValueError, match="unknown system"):
                    check_names([name])
    check_names(list(FAMILY_MODES["allie"]))


@pytest.mark.slow  # ~100 s on a 2-core CI box; the systems' own tests are in the default suite
@pytest.mark.parametrize("everything", [False, True], ids=["smoke", "all"])
def test_launch_evaluate_scores_every_system(everything, checkpoints, sample_pgn, tmp_path):
    names = _system_names(everything)
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        "-m",
        "launch.evaluate",
        f"--checkpoint={checkpoints['allie']}",
        f"--games={sample_pgn}",
        f"--output={out}",
        f"--systems={','.join(names)}",
        f"--maia_dir={maia_dir()}",
        f"--system_options=board_checkpoint={checkpoints['board']},mean_sims=8,max_sims=16",
        "--max_games=2",
        "--search_positions=6",
        "--plots=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    scored = report["move_accuracy"]
    for name in names:
        assert name in scored and scored[name]["positions"] > 0, (name, list(scored))
    paired = {(p["system"], p["baseline"]) for p in report["paired"]}
    for name in names:  # each search system against its own base, on the same positions
        base, plus, mode = name.partition("+")
        if plus:
            assert (name, base) in paired, (name, paired)
        elif name in SEARCHING:
            assert (name, "policy") in paired, (name, paired)
    # the records name every system, each scoring real positions
    assert all(p["positions"] > 0 for p in report["paired"])


# ---------------------------------------------------------------- launch.match


def _spec(family: str, mode: str, checkpoints) -> str:
    if family == "maia":
        return f"maia:{maia_dir()}:{mode}:1500"
    return f"allie:{checkpoints[family]}:{mode}:1500"


def _match(white: str, black: str, tmp_path: pathlib.Path, name: str) -> list[chess.pgn.Game]:
    pgn = tmp_path / f"{name}.pgn"
    cmd = [
        sys.executable,
        "-m",
        "launch.match",
        f"--white={white}",
        f"--black={black}",
        "--games=1",
        "--tc=60+1",
        "--max-plies=6",
        "--concurrency=2",
        f"--output={pgn}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = []
    with pgn.open() as fh:
        while (game := chess.pgn.read_game(fh)) is not None:
            out.append(game)
    return out


def _pairings(all_modes: bool) -> list[tuple[str, str, str, str]]:
    """(family, mode) entries paired off for matches: every entry once when ``all_modes``, else
    one search mode of each family against another family."""
    if not all_modes:
        return [("allie", "adaptive", "board", "search")]
    entries = [(f, m) for f, modes in FAMILY_MODES.items() for m in modes]
    half = (len(entries) + 1) // 2
    firsts, seconds = entries[:half], entries[half:] + entries[: half * 2 - len(entries)]
    return [(*a, *b) for a, b in zip(firsts, seconds, strict=True)]


def _check_match(pairing, checkpoints, tmp_path):
    wf, wm, bf, bm = pairing
    games = _match(
        _spec(wf, wm, checkpoints), _spec(bf, bm, checkpoints), tmp_path, f"{wf}-{wm}-{bf}-{bm}"
    )
    assert len(games) == 1
    for game in games:
        board = game.board()
        for move in game.mainline_moves():  # every move legal in turn (python-chess replays it)
            assert move in board.legal_moves
            board.push(move)
        assert board.ply() >= 6 or board.is_game_over(), game
        assert game.headers["Termination"] != "time forfeit", game.headers


@pytest.mark.slow  # a match process per pairing; test_match.py plays one in the default suite
@pytest.mark.parametrize("pairing", _pairings(all_modes=False), ids=lambda p: "-".join(p))
def test_launch_match_across_families(pairing, checkpoints, tmp_path):
    _check_match(pairing, checkpoints, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("pairing", _pairings(all_modes=True), ids=lambda p: "-".join(p))
def test_launch_match_every_family_and_mode(pairing, checkpoints, tmp_path):
    _check_match(pairing, checkpoints, tmp_path)


def test_policy_sums_are_probabilities(checkpoints, games):
    """Every family's ``policy`` decision carries the legal-move distribution it drew from."""
    for family in FAMILY_MODES:
        if family == "maia":
            maia_dir()
        d = _player(family, checkpoints).play(games[:1], "policy", 0)[0]
        total = float(np.sum(list(d.policy.values())))
        assert 0.5 < total <= 1.0 + 1e-4, (family, total)


def test_search_options_reach_maias_search_like_the_decoders():
    """``--system_options c_puct=…,selection=kl,lambda_schedule=paper`` (one list for every
    system) reaches maia+MODE's SearchConfig as it reaches the decoder's; Maia keeps its own
    budget knob (maia_sims) and a bad value is one error naming the key."""
    from allie_jax.baselines.eval_systems import maia_search_options
    from allie_jax.baselines.maia_search import MaiaSearchConfig
    from allie_jax.search.config import from_options

    options = {"c_puct": "2.5", "selection": "kl", "lambda_schedule": "paper", "mean_sims": "8"}
    maia = MaiaSearchConfig(mode="pibar", **maia_search_options(options)).search_config()
    decoder = from_options("search", options)
    for field in ("c_puct", "selection", "lambda_schedule"):
        assert getattr(maia, field) == getattr(decoder, field), field
    assert maia.mean_sims == MaiaSearchConfig().num_simulations  # not the decoder's mean_sims
    with pytest.raises(ValueError, match="c_puct"):
        maia_search_options({"c_puct": "fast"})
