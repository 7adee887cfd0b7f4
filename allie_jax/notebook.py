"""What the ``colab/`` notebooks call, so each cell stays one or two library calls.

The notebooks are executed in ``make test`` with tiny sizes (tests/test_notebooks.py); everything
here is plain library code with no notebook state, and display goes through IPython only when it
is there. Colab-only steps (installing from the repository, downloading a Lichess month) are
guarded by ``in_colab()`` in the notebooks themselves.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import chess
import chess.svg
from etils import epath

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "data" / "sample"
SAMPLE_GAMES = SAMPLE_DIR / "lichess_sample.pgn.zst"
LICHESS_MONTH_URL = (
    "https://database.lichess.org/standard/lichess_db_standard_rated_{month}.pgn.zst"
)
# The paper's Table 2 (move-matching accuracy over all Elo bins, Lichess test set).
PAPER_ACCURACY = {"policy": 0.557, "adaptive": 0.559}


# ---------------------------------------------------------------------------- setup
def in_colab() -> bool:
    return "google.colab" in sys.modules


def pip_install(spec: str) -> None:
    """``pip install spec`` into this kernel's Python (Colab: the repository with its extras)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)


def devices() -> dict[str, Any]:
    """The accelerator this runtime has: platform, count, kind."""
    import jax

    devs = jax.devices()
    return {
        "platform": devs[0].platform,
        "count": len(devs),
        "kind": devs[0].device_kind,
        "processes": jax.process_count(),
    }


def mesh_for_devices(model_size: str, n_devices: int | None = None) -> dict[str, int]:
    """The (data, fsdp, tensor) mesh for ``model_size`` on this runtime's devices.

    Data parallel when a full replica of the training state (parameters + two AdamW moments +
    gradients, float32: 16 bytes per parameter) fits in half a device's memory; otherwise the
    state is sharded over every device (FSDP), as on a Colab TPU v2-8 with 8 GiB per core.
    """
    import jax

    from allie_jax.model.config import ModelConfig

    n = n_devices or jax.device_count()
    cfg = ModelConfig.named(model_size)
    d = cfg.embed_dim  # GPT-2: 12 d^2 per block, plus the token and position embeddings
    params = cfg.num_layers * 12 * d * d + (cfg.vocab_size + cfg.max_len) * d
    stats = jax.devices()[0].memory_stats() or {}
    memory = stats.get("bytes_limit")
    if n == 1 or (memory and params * 16 < memory / 2):
        return {"data": n, "fsdp": 1, "tensor": 1}
    return {"data": 1, "fsdp": n, "tensor": 1}


def download(url: str, dest: str | pathlib.Path, max_bytes: int | None = None) -> pathlib.Path:
    """Stream ``url`` to ``dest``, stopping after ``max_bytes`` (a cut .zst is fine: prepare
    reads the complete games before the cut and reports it)."""
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    done = 0
    with urllib.request.urlopen(url) as r, open(dest, "wb") as f:  # noqa: S310 - a user's URL
        while max_bytes is None or done < max_bytes:
            chunk = r.read(min(1 << 20, (max_bytes - done) if max_bytes else 1 << 20))
            if not chunk:
                break
            f.write(chunk)
            done += len(chunk)
    return dest


# ---------------------------------------------------------------------------- data and training
def prepare_games(
    inputs: Sequence[str | pathlib.Path] | None,
    out_dir: str | pathlib.Path,
    *,
    val_frac: float = 0.05,
    test_frac: float = 0.05,
    events: str = "all",
) -> dict[str, Any]:
    """PGN files (default: the bundled sample) -> ArrayRecord shards; the prepare stats."""
    from allie_jax.data.prepare import PrepareConfig, prepare

    files = [str(p) for p in inputs] if inputs else sorted(map(str, SAMPLE_DIR.glob("*.pgn.zst")))
    config = PrepareConfig(events=events, val_frac=val_frac, test_frac=test_frac)
    return prepare(files, str(out_dir), config)


def train(
    config_name: str, data_dir: str | pathlib.Path, workdir: str | pathlib.Path, **overrides: Any
):
    """Train ``configs/<config_name>.py`` with dotted overrides (``{"train.steps": 20}``)."""
    import importlib

    from allie_jax.train import train_and_evaluate

    config = importlib.import_module(f"configs.{config_name}").get_config()
    config.data.data_dir = str(data_dir)
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"{key}: no such config field in configs/{config_name}.py")
        node[leaf] = value
    return train_and_evaluate(config, workdir)


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, float]]:
    """The run's ``metrics.jsonl`` (one dict per logged step and split)."""
    path = epath.Path(workdir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def throughput(workdir: str | pathlib.Path) -> dict[str, float]:
    """Tokens/s and MFU of the last logged training window (the first one includes compilation)."""
    rows = [r for r in read_metrics(workdir) if r["split"] == "train" and "tokens_per_second" in r]
    if not rows:
        raise ValueError(f"{workdir}: no training metrics logged yet")
    last = rows[-1]
    return {
        "step": last["step"],
        "tokens_per_second": last["tokens_per_second"],
        "mfu": last["mfu"],
        "step_time_s": last.get("step_time", float("nan")),
    }


def loss_curve(workdir: str | pathlib.Path):
    """A matplotlib figure of the training loss (and validation loss where evaluated)."""
    import matplotlib.pyplot as plt

    rows = read_metrics(workdir)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for split, style in (("train", "-"), ("val", "o-")):
        pts = [(r["step"], r["loss"]) for r in rows if r["split"] == split and "loss" in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=f"{split} loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (policy + time + value)")
    ax.legend()
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- evaluation
def evaluate(
    checkpoint: Any,
    games: str | pathlib.Path = SAMPLE_GAMES,
    out_dir: str | pathlib.Path | None = None,
    **config: Any,
) -> dict:
    """``allie_jax.eval.evaluate`` with ``EvalConfig`` fields as keywords."""
    from allie_jax.eval.evaluate import EvalConfig
    from allie_jax.eval.evaluate import evaluate as run

    if "systems" in config:
        config["systems"] = tuple(config["systems"])
    return run(checkpoint, games, out_dir, EvalConfig(**config))


def show_plots(out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """Display the evaluation's PNG plots inline; the paths shown."""
    paths = sorted(pathlib.Path(out_dir).glob("*.png"))
    _display(*(_image(p) for p in paths))
    return paths


def accuracy_table(report: Mapping, systems: Iterable[str] = ("policy", "adaptive")) -> str:
    """Markdown: move-matching accuracy per Elo bin for ``systems``, then the paper's overall.

    ``adaptive`` is scored on a seeded subsample of positions (``search_positions``), so its
    bins hold fewer positions than the policy's; ``n`` is shown for each.
    """
    acc = report["move_accuracy"]
    systems = [s for s in systems if s in acc]
    bins = sorted({int(b) for s in systems for b in acc[s]["by_elo"]})
    head = "| Elo bin | " + " | ".join(f"{s} (n)" for s in systems) + " |"
    lines = [head, "|" + " --- |" * (len(systems) + 1)]

    def cell(r: Mapping | None) -> str:
        if not r or r.get("n", 0) == 0:
            return "–"
        return f"{100 * r['value']:.1f}% ({r['n']})"

    for b in bins:
        row = [cell(acc[s]["by_elo"].get(str(b), acc[s]["by_elo"].get(b))) for s in systems]
        lines.append(f"| {b}–{b + 99} | " + " | ".join(row) + " |")
    lines.append("| **all** | " + " | ".join(cell(acc[s]["overall"]) for s in systems) + " |")
    paper = [f"{100 * PAPER_ACCURACY[s]:.1f}%" if s in PAPER_ACCURACY else "–" for s in systems]
    lines.append("| paper (all bins) | " + " | ".join(paper) + " |")
    return "\n".join(lines)


def convert_released(best_pt: str | pathlib.Path, out_dir: str | pathlib.Path) -> pathlib.Path:
    """The released Allie ``best.pt`` -> an allie-jax model directory (safe loading only)."""
    from allie_jax.convert import convert_released_allie
    from allie_jax.model.checkpoint import save_model

    return save_model(convert_released_allie(best_pt), out_dir)


# ---------------------------------------------------------------------------- playing
def board_svg(board: chess.Board, size: int = 320) -> str:
    """The position as SVG, the last move highlighted, a check shown on the king."""
    last = board.peek() if board.move_stack else None
    check = board.king(board.turn) if board.is_check() else None
    return chess.svg.board(board, lastmove=last, check=check, size=size)


@dataclasses.dataclass
class NotebookGame:
    """A game against Allie in a notebook: ``move("e2e4")`` plays yours and shows its answer.

    The same game session as the browser page (``allie_jax.engine.web``): python-chess checks
    your move, the engine plays with both ratings in the headers, and each answer shows its
    predicted think time, value and top moves under the board. Before the first move the engine
    compiles every shape its mode can meet (``Allie.warmup``, as the UCI engine does), shown as
    "preparing", before any clock starts. With ``base_s > 0`` both sides are on the clock: the
    engine's search gets the clock's budget as its deadline, and every move the game's id, so
    the search reuses what it read of the game on earlier moves.
    """

    allie: Any
    human_colour: str = "white"
    engine_elo: int = 1500
    human_elo: int = 1500
    mode: str = "adaptive"
    show: bool = True
    base_s: float = 0.0
    increment_s: float = 0.0

    def __post_init__(self) -> None:
        import time

        from allie_jax.engine.web import GameSession, GameSettings, allie_player

        settings = GameSettings.from_request(
            {
                "human_colour": self.human_colour,
                "engine_elo": self.engine_elo,
                "human_elo": self.human_elo,
                "mode": self.mode,
                "base_s": self.base_s,
                "increment_s": self.increment_s,
            }
        )
        self.warmup_s = 0.0
        if self.show:
            _display(_html(f"<p>Preparing Allie: compiling the {self.mode} mode once …</p>"))
        t = time.monotonic()
        self.allie.warmup(self.mode, 1)  # every player has one (a no-op where nothing compiles)
        self.warmup_s = time.monotonic() - t
        self.session = GameSession(settings)  # the clocks start here, after the warm-up
        self._play = allie_player(self.allie)
        self.log: list[dict[str, Any]] = []
        if self.session.engine_to_move:
            self._engine()

    @property
    def board(self) -> chess.Board:
        return self.session.board

    def move(self, uci: str) -> dict[str, Any] | None:
        """Play ``uci`` (refused with a clear error if illegal); the engine's answer, or None."""
        self.session.human_move(uci)
        return self._engine() if self.session.engine_to_move else self._show(None)

    def takeback(self) -> None:
        """Undo your last move and the engine's answer to it."""
        self.session.takeback()
        self._show(None)

    def offer_draw(self) -> bool:
        """Offer a draw; Allie accepts when its value head does not favour its own side."""

        def evaluate(game):
            return self.allie.predict([game])[0].value_white

        agreed = self.session.offer_draw(evaluate)
        if self.show:
            _display(_html(f"<p>{self.session.notice}</p>"))
        return agreed

    def _engine(self) -> dict[str, Any] | None:
        info = self.session.engine_move(self._play)
        row = dataclasses.asdict(info) if info else None
        if row:
            self.log.append(row)
        return self._show(row)

    def _show(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.show:
            text = describe_engine_move(row) if row else ""
            if self.session.result:
                text += (
                    f"<p><b>Game over: {self.session.result} ({self.session.termination})</b></p>"
                )
            _display(_html(board_svg(self.board) + text))
        return row

    def pgn(self) -> str:
        return self.session.pgn()


def describe_engine_move(row: Mapping[str, Any]) -> str:
    """One HTML line: the move, predicted think time, value (White's view), top moves."""
    top = ", ".join(f"{san} {100 * p:.0f}%" for san, p in row["top_moves"])
    clock = ""
    if row.get("budget_s") is not None:
        clock = f", took {row['spent_s']:.1f} s of its {row['budget_s']:.1f} s budget"
    return (
        f"<p>Allie played <b>{row['san']}</b>: predicted think time "
        f"{row['predicted_think_s']:.1f} s, value (White) {row['value_white']:+.2f}, "
        f"{row['sims']} simulations{clock}; top moves {top}</p>"
    )


# ---------------------------------------------------------------------------- display
def _display(*objs: Any) -> None:
    try:
        from IPython.display import display
    except ImportError:  # plain Python: nothing to render into
        return
    display(*objs)


def _html(text: str) -> Any:
    try:
        from IPython.display import HTML
    except ImportError:
        return text
    return HTML(text)


def _image(path: pathlib.Path) -> Any:
    try:
        from IPython.display import Image
    except ImportError:
        return path
    return Image(filename=str(path))


def show_markdown(text: str) -> None:
    try:
        from IPython.display import Markdown
    except ImportError:
        print(text)
        return
    _display(Markdown(text))
