"""The UCI engine's options: the one table that declares each option and sets it, and what the
options ask of a move (the preset and its SearchConfig overrides, Allie's rating).

Standard library and light modules only: the table is listed in answer to ``uci``, before
python-chess, numpy or JAX load.

Allie's own rating: ``SelfElo`` if set, else ``UCI_Elo`` when ``UCI_LimitStrength`` is on (the UCI
convention: a GUI sending every default plays as Allie-Policy does, at the opponent's rating),
else the opponent's rating (``UCI_Opponent`` or ``OppoElo``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from allie_jax import vocab
from allie_jax.engine.time_manager import MOVE_OVERHEAD_S
from allie_jax.modes import MODES, SEARCH_MODES

PRESETS = MODES  # the play modes (allie_jax.modes: standard library only, so uciok stays quick)
LAMBDA_SCHEDULES = ("constant", "paper", "released")
SELECTIONS = ("puct", "kl")  # SearchConfig.selection
# SearchConfig.virtual_loss (search.config.VIRTUAL_LOSSES; spelt here: that import loads JAX)
VIRTUAL_LOSSES = ("loss", "visit")
DEFAULT_ELO = 1500


@dataclasses.dataclass
class Options:
    """The engine's UCI options (mutable: ``setoption`` changes them between games)."""

    self_elo: int = 0  # 0: play at the opponent's rating (Allie-Policy's setting)
    uci_elo: int = DEFAULT_ELO  # Allie's rating when limit_strength is on
    limit_strength: bool = False  # UCI_LimitStrength: off = the opponent's rating
    oppo_elo: int = DEFAULT_ELO
    opponent_elo: int | None = None  # from UCI_Opponent, overrides oppo_elo when present
    mode: str = "adaptive"
    mean_sims: int = 50
    max_sims: int = 200
    gumbel_c_scale: float = 0.1  # the Gumbel modes' KL knob: λ ∝ 1 / c_scale
    temperature: float = 1.0
    human_pacing: bool = False
    allow_resign: bool = False
    show_wdl: bool = False
    multipv: int = 1
    seed: int = 0
    time_control: str = ""  # "" = infer from the first go of the game
    move_overhead_ms: int = int(MOVE_OVERHEAD_S * 1000)
    ponder: bool = False
    c_puct: float | None = None  # None: the preset's
    anchor_lambda: float | None = None
    lambda_schedule: str | None = None
    selection: str | None = None  # None: the preset's ("puct")
    virtual_loss: str | None = None  # None: SearchConfig's ("visit"); K > 1 only
    leaf_batch: int | None = None


# name, UCI declaration, setter(options, raw value) — the single place an option is defined.
def _spin(lo: int, hi: int, field: str) -> Callable[[Options, str], None]:
    def set_(o: Options, raw: str) -> None:
        value = int(raw)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is outside [{lo}, {hi}]")
        setattr(o, field, value)

    return set_


def _check(field: str) -> Callable[[Options, str], None]:
    def set_(o: Options, raw: str) -> None:
        low = raw.strip().lower()
        if low not in ("true", "false"):
            raise ValueError(f"{raw!r} is not true/false")
        setattr(o, field, low == "true")

    return set_


def _set_uci_elo(o: Options, raw: str) -> None:
    _spin(vocab.MIN_ELO, vocab.MAX_ELO, "uci_elo")(o, raw)


def _set_mode(o: Options, raw: str) -> None:
    if raw.strip().lower() not in PRESETS:
        raise ValueError(f"{raw!r} is not one of {', '.join(PRESETS)}")
    o.mode = raw.strip().lower()


def _set_temperature(o: Options, raw: str) -> None:
    value = float(raw)
    if not (math.isfinite(value) and 0.0 <= value <= 10.0):
        raise ValueError(f"{raw!r} is not a temperature in [0, 10]")
    o.temperature = value


def _set_c_scale(o: Options, raw: str) -> None:
    value = float(raw)
    if not (math.isfinite(value) and 0.0 < value <= 1000.0):
        raise ValueError(f"{raw!r} is not a c_scale in (0, 1000]")
    o.gumbel_c_scale = value


def _positive_float(field: str, hi: float) -> Callable[[Options, str], None]:
    def set_(o: Options, raw: str) -> None:
        if raw.strip().lower() in ("", "<preset>", "<empty>"):
            setattr(o, field, None)  # back to the preset's value
            return
        value = float(raw)
        if not (math.isfinite(value) and 0.0 < value <= hi):
            raise ValueError(f"{raw!r} is not a number in (0, {hi:g}]")
        setattr(o, field, value)

    return set_


def _set_schedule(o: Options, raw: str) -> None:
    if raw.strip().lower() not in LAMBDA_SCHEDULES:
        raise ValueError(f"{raw!r} is not one of {', '.join(LAMBDA_SCHEDULES)}")
    o.lambda_schedule = raw.strip().lower()


def _set_virtual_loss(o: Options, raw: str) -> None:
    if raw.strip().lower() not in VIRTUAL_LOSSES:
        raise ValueError(f"{raw!r} is not one of {', '.join(VIRTUAL_LOSSES)}")
    o.virtual_loss = raw.strip().lower()


def _set_selection(o: Options, raw: str) -> None:
    if raw.strip().lower() not in SELECTIONS:
        raise ValueError(f"{raw!r} is not one of {', '.join(SELECTIONS)}")
    o.selection = raw.strip().lower()


def _set_opponent(o: Options, raw: str) -> None:
    o.opponent_elo = parse_opponent(raw)


def _set_tc(o: Options, raw: str) -> None:
    raw = raw.strip()
    if raw and raw != "<empty>" and not _valid_tc(raw):
        raise ValueError(f"{raw!r} is not a time control like 180+2")
    o.time_control = "" if raw == "<empty>" else raw


def _valid_tc(tc: str) -> bool:
    base, _, inc = vocab.normalize_time_control(tc).partition("+")
    return base.isdigit() and inc.isdigit()


OPTIONS: dict[str, tuple[str, Callable[[Options, str], None]]] = {
    "UCI_LimitStrength": ("type check default false", _check("limit_strength")),
    "UCI_Elo": (
        f"type spin default {DEFAULT_ELO} min {vocab.MIN_ELO} max {vocab.MAX_ELO}",
        _set_uci_elo,
    ),
    "SelfElo": (
        f"type spin default 0 min 0 max {vocab.MAX_ELO}",
        _spin(0, vocab.MAX_ELO, "self_elo"),
    ),
    "OppoElo": (
        f"type spin default {DEFAULT_ELO} min {vocab.MIN_ELO} max {vocab.MAX_ELO}",
        _spin(vocab.MIN_ELO, vocab.MAX_ELO, "oppo_elo"),
    ),
    "UCI_Opponent": ("type string default <empty>", _set_opponent),
    "Mode": ("type combo default adaptive " + " ".join(f"var {p}" for p in PRESETS), _set_mode),
    "MeanSims": ("type spin default 50 min 0 max 2000", _spin(0, 2000, "mean_sims")),
    "MaxSims": ("type spin default 200 min 1 max 2000", _spin(1, 2000, "max_sims")),
    "Temperature": ("type string default 1.0", _set_temperature),
    "GumbelCScale": ("type string default 0.1", _set_c_scale),
    "HumanPacing": ("type check default false", _check("human_pacing")),
    "AllowResign": ("type check default false", _check("allow_resign")),
    "UCI_ShowWDL": ("type check default false", _check("show_wdl")),
    "MultiPV": ("type spin default 1 min 1 max 20", _spin(1, 20, "multipv")),
    "Seed": ("type spin default 0 min 0 max 2147483647", _spin(0, 2**31 - 1, "seed")),
    "TimeControl": ("type string default <empty>", _set_tc),
    "Move Overhead": (
        f"type spin default {int(MOVE_OVERHEAD_S * 1000)} min 0 max 10000",
        _spin(0, 10000, "move_overhead_ms"),
    ),
    "Ponder": ("type check default false", _check("ponder")),
    "CPuct": ("type string default 1.25", _positive_float("c_puct", 100.0)),
    "Lambda": ("type string default <preset>", _positive_float("anchor_lambda", 1000.0)),
    "LambdaSchedule": (
        "type combo default constant " + " ".join(f"var {v}" for v in LAMBDA_SCHEDULES),
        _set_schedule,
    ),
    "Selection": (
        "type combo default puct " + " ".join(f"var {v}" for v in SELECTIONS),
        _set_selection,
    ),
    # the engine's K when unset is the launcher's (launch.uci: api.PLAY_LEAF_BATCH = 16)
    "LeafBatch": ("type spin default 16 min 1 max 64", _spin(1, 64, "leaf_batch")),
    # how a step's pending leaves steer its later selections (LeafBatch > 1)
    "VirtualLoss": (
        "type combo default visit " + " ".join(f"var {v}" for v in VIRTUAL_LOSSES),
        _set_virtual_loss,
    ),
}
_OPTION_KEYS = {k.lower(): k for k in OPTIONS}


def option_key(name: str) -> str | None:
    """The table's name for a ``setoption`` name (UCI option names are case-insensitive)."""
    return _OPTION_KEYS.get(name.lower())


def parse_opponent(raw: str) -> int | None:
    """The rating in lichess-bot's ``UCI_Opponent`` value ``title rating type name``.

    ``none 1500 human Bob`` -> 1500; a rating of ``none`` (or anything unparsable) -> None.
    """
    parts = raw.split()
    if len(parts) >= 2:
        try:
            return int(round(float(parts[1])))
        except ValueError:
            return None
    return None


def opponent_elo(o: Options) -> int:
    """The opponent's rating: ``UCI_Opponent``'s when it named one, else ``OppoElo``."""
    oppo = o.opponent_elo if o.opponent_elo is not None else o.oppo_elo
    return min(max(oppo, vocab.MIN_ELO), vocab.MAX_ELO)


def own_elo(o: Options) -> tuple[int, str]:
    """Allie's rating token and where it comes from (see the module docstring)."""
    if o.self_elo:
        return o.self_elo, "SelfElo"
    if o.limit_strength:
        return o.uci_elo, "UCI_Elo"
    return opponent_elo(o), "the opponent's rating"


def play_settings(o: Options) -> tuple[str, dict[str, Any]]:
    """The preset and SearchConfig overrides the options ask for (warm-up and play agree)."""
    preset = o.mode
    overrides: dict[str, Any] = {"temperature": o.temperature}
    if o.temperature <= 0:  # temperature 0 means argmax (SearchConfig wants T > 0)
        overrides = {"temperature": 1.0, "sampling": "argmax"}
    if preset in SEARCH_MODES:
        overrides["mean_sims"] = o.mean_sims
        overrides["max_sims"] = max(o.max_sims, o.mean_sims)
        for field in ("c_puct", "anchor_lambda", "lambda_schedule", "leaf_batch", "virtual_loss"):
            if getattr(o, field) is not None:
                overrides[field] = getattr(o, field)
        if o.selection is not None and not preset.startswith("gumbel"):
            overrides["selection"] = o.selection  # Gumbel modes select by halving
    if preset.startswith("gumbel"):
        overrides["gumbel_c_scale"] = o.gumbel_c_scale
    return preset, overrides
