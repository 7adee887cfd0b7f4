"""Every comparison paired, every interval clustered: the report's counts against an independent
count (python-chess replay + one model call per game, no report code), paired differences against
the records read with pyarrow, the cluster bootstrap against a direct resampling, and system names
read from SearchConfig's modes."""

from __future__ import annotations

import dataclasses
import importlib
import math

import chess
import chess.pgn
import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.eval import systems as sysmod
from allie_jax.eval.tally import ExactSum, Tally
from allie_jax.game import encode_game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import open_text, read_games
from allie_jax.search.config import ADAPTIVE_MODES, MODES, SEARCH_MODES

ev = importlib.import_module("allie_jax.eval.evaluate")


@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


def test_every_search_mode_is_a_system_name():
    for mode in MODES:
        sysmod.check_names([mode])
    for mode in SEARCH_MODES:  # the board family and Maia have no think time: no adaptive
        names = [f"maia+{mode}", f"maia-1500+{mode}", f"board+{mode}"]
        if mode in ADAPTIVE_MODES:
            for name in names:
                with pytest.raises(ValueError, match="unknown system"):
                    sysmod.check_names([name])
        else:
            sysmod.check_names(names)
    sysmod.check_names(["maia", "maia-1100", "board", "maia+visits"])
    for bad in ("nonesuch", "maia+policy", "board+nonesuch", "maia-x", "board+visits"):
        with pytest.raises(ValueError, match="unknown system"):
            sysmod.check_names([bad])
    assert sysmod.resolve("gumbel") is sysmod.resolve("search")


def test_system_options_reach_the_search_config():
    cfg = sysmod.search_config("gumbel", {"lambda": "0.25", "leaf_batch": "2", "maia_dir": "x"})
    assert cfg.mode == "gumbel" and cfg.anchor_lambda == 0.25 and cfg.leaf_batch == 2
    with pytest.raises(ValueError, match="leaf_batch"):
        sysmod.search_config("search", {"leaf_batch": "two"})


def _independent(model, pgn, max_games: int, elo: int | None = None):
    """(hits, positions, per-mover-Elo-bin {bin: [hits, n]}) of the Allie policy's top legal move,
    from python-chess and one model call per game; the number of near ties (top two legal logits
    within 1e-3, where a batched pass may order them otherwise) comes along."""
    hits = n = ties = 0
    by_bin: dict[int, list[int]] = {}
    ours = iter(read_games(pgn))
    with open_text(pgn) as f:
        done = 0
        while done < max_games and (pg := chess.pgn.read_game(f)) is not None:
            nodes = list(pg.mainline())
            if not nodes:
                continue
            done += 1
            game = next(ours)  # the same game, as the model's tokens are built from it
            assert game.moves == [nd.move.uci() for nd in nodes]
            if elo is not None:
                game = dataclasses.replace(game, white_elo=elo, black_elo=elo)
            enc = encode_game(game, partial=True)
            tokens = enc.tokens[: model.config.max_len]
            logits = np.asarray(model(tokens[None]).policy_logits[0, enc.header_len - 1 :])
            base = float(pg.headers["TimeControl"].split("+")[0])
            board = pg.board()
            for i, node in enumerate(nodes):
                before = base if i < 2 else nodes[i - 2].clock()
                if i < len(logits) and i >= 10 and not (before is not None and before < 30):
                    legal = [vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves]
                    row = logits[i, legal]
                    top2 = np.sort(row)[-2:]
                    ties += bool(len(row) > 1 and top2[1] - top2[0] < 1e-3)
                    hit = legal[int(np.argmax(row))] == vocab.MOVE_TO_ID[node.move.uci()]
                    hits += hit
                    n += 1
                    mover = pg.headers["WhiteElo" if i % 2 == 0 else "BlackElo"]
                    cell = by_bin.setdefault(int(mover) // 100 * 100, [0, 0])
                    cell[0] += hit
                    cell[1] += 1
                board.push(node.move)
    return hits, n, by_bin, ties


def test_report_counts_equal_an_independent_count(tiny_model, sample_pgn, tmp_path):
    cfg = ev.EvalConfig(
        systems=("policy", "greedy"), max_games=6, random_games=0, progress=False, plots=False
    )
    report = ev.evaluate(tiny_model, sample_pgn, tmp_path, cfg)
    acc = report["move_accuracy"]
    want = {}
    for name, elo in (("policy", None), ("greedy", 2500)):
        hits, n, by_bin, ties = _independent(tiny_model, sample_pgn, 6, elo)
        want[name] = hits
        got = acc[name]["overall"]
        assert got["n"] == n > 100
        assert abs(got["successes"] - hits) <= ties  # equal but for near-tied logits
        if not ties:
            assert got["successes"] == hits and got["value"] == pytest.approx(hits / n)
            for b, (h, k) in by_bin.items():
                assert acc[name]["by_elo"][str(b)]["n"] == k
                assert acc[name]["by_elo"][str(b)]["successes"] == h
    (pair,) = [p for p in report["paired"] if p["system"] == "greedy"]
    assert pair["baseline"] == "policy" and pair["positions"] == acc["policy"]["overall"]["n"]
    assert pair["difference"] == pytest.approx(
        (acc["greedy"]["overall"]["successes"] - acc["policy"]["overall"]["successes"])
        / pair["positions"]
    )
    assert pair["ci_low"] <= pair["difference"] <= pair["ci_high"]
    assert pair["games"] == 6 and report["warnings"]  # 6 games: the report warns
    md = (tmp_path / "report.md").read_text()
    assert "Warning" in md and "| greedy | policy |" in md


class _Fake:
    """A cheap system: the first (``fake``) or last (``fake+search``, on the subsample) legal
    move by id: two systems that disagree, for the pairing plumbing."""

    info: dict = {}

    def __init__(self, name, ctx):
        self.name = name
        self.subsample = "+" in name

    def score(self, pos):
        out = sysmod.Scores.empty(len(pos))
        human = pos.human_move()
        for p in range(len(pos)):
            legal = np.sort(pos.legal_ids(p))
            if not legal.size:
                continue
            probs = np.full(1968, 0.5 / len(legal))
            probs[legal[-1] if self.subsample else legal[0]] += 0.5
            out.set_from_distribution(p, probs, legal, int(human[p]), all_tokens=False)
        return out


@pytest.fixture()
def fake():
    sysmod.register("fake", _Fake)
    yield
    sysmod._REGISTRY.pop("fake")


def test_search_systems_are_paired_with_their_own_base(sample_pgn, tmp_path, fake):
    """``fake+search`` alone: its base ``fake`` is scored too, and the paired difference is the
    one read straight from the records on the positions both scored."""
    cfg = ev.EvalConfig(
        systems=("fake+search",), max_games=8, search_positions=60, random_games=0,
        progress=False, plots=False, baseline=None,
    )  # fmt: skip
    report = ev.evaluate(None, sample_pgn, tmp_path, cfg)
    assert set(report["move_accuracy"]) == {"fake", "fake+search"}
    (pair,) = report["paired"]
    assert (pair["system"], pair["baseline"]) == ("fake+search", "fake")
    files = sorted(str(f) for f in (tmp_path / "records").glob("shard-*/chunk-*.parquet"))
    t = ds.dataset(files, format="parquet").to_table()
    rows = t.filter(
        pc.field("fake+search.scored") & pc.field("fake.scored") & (pc.field("ply") >= 10)
    ).to_pylist()
    rows = [r for r in rows if r["human_move"] and not (r["clock_before"] or 1e9) < 30]
    a = np.array([r["fake+search.top_moves"][0] == r["human_move"] for r in rows], float)
    b = np.array([r["fake.top_moves"][0] == r["human_move"] for r in rows], float)
    assert pair["positions"] == len(rows) == 60
    assert pair["difference"] == pytest.approx((a - b).mean())
    assert pair["system_accuracy"]["value"] == pytest.approx(a.mean())
    assert report["move_accuracy"]["fake"]["overall"]["n"] > 60  # the base scores every position
    # --baseline at report time adds a pair; clustering by player changes the unit
    again = ev.report_from_records(tmp_path / "records", baseline="fake", cluster="player")
    assert again["meta"]["cluster"] == "player" and again["meta"]["clusters"] > 8
    assert [(p["system"], p["baseline"]) for p in again["paired"]] == [("fake+search", "fake")]


def test_cluster_bootstrap_matches_direct_resampling():
    """The tally's interval of a clustered proportion: the point estimate is the pooled rate, and
    the interval matches a direct game-resampling bootstrap of the same data (to Monte Carlo
    error), and is wider than the binomial interval when games differ."""
    rng = np.random.default_rng(1)
    games = 400
    skill = rng.uniform(0.1, 0.9, games)  # strong between-game differences
    sizes = rng.integers(20, 60, games)
    flags = [rng.random(k) < s for s, k in zip(skill, sizes, strict=True)]
    t = Tally()
    for g0 in range(0, games, 37):  # arbitrary chunks
        ids = np.concatenate([[f"g{g}"] * sizes[g] for g in range(g0, min(g0 + 37, games))])
        vals = np.concatenate(flags[g0 : g0 + 37])
        t.add("acc", t.clusters(ids), vals.astype(float))
    iv = t.interval("acc", num_resamples=2000, seed=0)
    hits = np.array([f.sum() for f in flags], float)
    n = sizes.astype(float)
    assert iv.value == pytest.approx(hits.sum() / n.sum()) and iv.clusters == games
    idx = np.random.default_rng(2).integers(0, games, size=(4000, games))
    ref = hits[idx].sum(1) / n[idx].sum(1)
    lo, hi = np.quantile(ref, [0.025, 0.975])
    assert iv.lo == pytest.approx(lo, abs=0.006) and iv.hi == pytest.approx(hi, abs=0.006)
    p = iv.value
    binomial = 1.96 * math.sqrt(p * (1 - p) / n.sum())
    assert (iv.hi - iv.lo) / 2 > 2 * binomial


def test_exact_sums_do_not_depend_on_order():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_000) * 10.0 ** rng.integers(-8, 8, 100_000)
    a, b = ExactSum(), ExactSum()
    a.add(x)
    for part in np.array_split(x[rng.permutation(x.size)], 7):
        b.add(part)
    assert a.value == b.value == math.fsum(x.tolist())
