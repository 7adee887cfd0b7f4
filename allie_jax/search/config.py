"""Search settings: one frozen dataclass, with the paper's four presets.

Defaults follow the released Allie (y0mingzhang/allie, ``AdaptiveMCTS``) except where SPEC §4
lists a bug to fix; each such field names the released value so it can be reproduced:

- ``fpu_mode="absolute", fpu=0.0`` gives unvisited children Q = 0 (released); the default
  ``"reduction"`` gives them the parent's running value minus ``fpu``.
- ``lambda_schedule="released"`` gives the released final-policy λ (c_puct scaled per game by
  sqrt(mean_sims / N), then λ_N = c·sqrt(ΣN)/(|A|+ΣN)); ``lambda_sqrt=False`` drops the square
  root of ΣN as the released code did. The default is a constant λ (``anchor_lambda``) instead.
- The root evaluation always counts as a visit (the released first simulation scored every child
  0 and took the first legal move): not configurable, it is how mctx counts visits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from allie_jax.game import TIME_MEAN
from allie_jax.modes import ADAPTIVE_MODES, MODES, SEARCH_MODES  # the one mode list

FINAL_POLICIES = ("pibar", "visits")
FPU_MODES = ("absolute", "reduction")
SAMPLING = ("sample", "argmax", "rating-based")
RULES = ("standard", "released")
LAMBDA_SCHEDULES = ("constant", "paper", "released")
GUMBEL_TRANSFORMS = ("anchor", "mctx")
FINAL_SUPPORTS = ("visited", "legal")
SELECTIONS = ("puct", "kl")
# what a step's pending leaves (leaf_batch > 1) change for its later selections (tree_search's
# docstring): "loss" a lost visit (AlphaGo Zero), "visit" a visit in pUCT's exploration term only
# (lc0's in-flight visits)
VIRTUAL_LOSSES = ("loss", "visit")
# The default human-anchor strength λ, in value units (Q ∈ [−1, 1]): the paper's λ_N at the mean
# budget, c·sqrt(N)/(|A| + N) with c = 1.25, N = 50 and a typical |A| = 30 legal moves
# (1.25·sqrt(50)/80 = 0.1105), so the constant default anchors as the paper's search did at N = 50.
DEFAULT_ANCHOR_LAMBDA = 0.11


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """How a move is chosen. ``mode`` picks the budget rule; the rest tune the search."""

    mode: str = "adaptive"
    mean_sims: int = 50  # fixed budget of ``search``; target mean of ``adaptive``
    max_sims: int = 200  # adaptive budgets are clipped to [0, max_sims]
    sims_per_second: float = 50.0 / TIME_MEAN  # c of N = round(c · t̂): ≈ 10.78
    max_think_time: float = 200.0  # t̂ is clipped to [0, max_think_time] s before the budget rule
    c_puct: float = 1.25  # scaled per game to c_puct · sqrt(mean_sims / budget)
    c_base: float = 19652.0  # pUCT's c grows as log((N + c_base + 1) / c_base)
    scale_c_puct: bool = True  # False: every game uses c_puct unscaled
    fpu_mode: str = "reduction"  # "absolute": Q(unvisited) = fpu; "reduction": V(parent) − fpu
    fpu: float = 0.0
    lambda_sqrt: bool = True  # False: "paper"/"released" λ_N without the square root of ΣN
    # The human anchor's strength: the final policy (π̄, and Gumbel's "anchor" transform) solves
    # argmax_π Σ_a q(a)·π(a) − λ·KL(anchor ‖ π), so λ is in value units: a move has to gain about λ
    # in Q (on [−1, 1]) before it moves e-fold away from the anchor. ``lambda_schedule`` says how
    # λ depends on the root's visit total ΣN, its |A| legal moves and the game's budget N:
    # - "constant" (default): λ = anchor_lambda at every budget. The paper's aim (seed 000,
    #   appendix MCTS): "In adaptive MCTS (AllieAdaptiveSearch), we scale c by the square root of
    #   the search budget to achieve the same effect of a constant regularization strength."
    # - "paper": λ_N = c_puct·sqrt(ΣN)/(|A|+ΣN) with c_puct unscaled: Grill et al.'s λ, of which
    #   seed 000 says "the KL-regularization strength λ ∼ c/sqrt(N_sim), where c is a
    #   hyperparameter", and seed 002 (piKL) "λ ∼ c_puct·sqrt(N) ... For any fixed computational
    #   budget N, we can therefore tune c_puct to vary the strength of that prior".
    # - "released": the released code's pairing, c = c_puct·sqrt(mean_sims/N) (the per-game scaled
    #   c_puct) in the same λ_N: c_puct·sqrt(mean_sims)/(|A|+ΣN) when ΣN = N, which falls as N
    #   grows (0.25 at N = 5, 0.11 at N = 50, 0.04 at N = 200 for |A| = 30).
    anchor_lambda: float = DEFAULT_ANCHOR_LAMBDA  # λ of "constant" (value units, > 0)
    lambda_schedule: str = "constant"  # "constant" | "paper" | "released"
    final_policy: str = "pibar"  # or "visits" (visit-count distribution)
    # How a pUCT-mode search (``search``, ``adaptive``) picks a child at every node:
    # - "puct" (default): Allie's pUCT score (search/selection.py, ``make_puct_selection``);
    #   the anchor holds only the root's final policy.
    # - "kl": piKL applied recursively (``selection.make_kl_selection``): every node solves
    #   π̄_s = argmax_π Σ_a Q(s, a)·π(a) − λ·KL(P(s, ·) ‖ π) with the λ above (its schedule,
    #   ``anchor_lambda``, ``c_puct``) and takes argmax_a π̄_s(a) − N(s, a)/(1 + ΣN(s)), so every
    #   node's visits follow the human prior P(s, ·) (the caller's anchor at the root, when given)
    #   with the strength the user set. Gumbel modes select by sequential halving and refuse it.
    selection: str = "puct"
    # The moves the final policy (π̄; Gumbel's "anchor" π') may put mass on once the root has
    # visits. "visited": only those the search visited (the anchor renormalised over them), so
    # the search never plays a move it holds no value for; "legal": every legal move, unvisited
    # ones valued by completed Q (mctx's mixed value).
    final_support: str = "visited"
    pibar_iterations: int = 64  # bisection steps for π̄ (float32 converges in < 40)
    temperature: float = 1.0  # softmax temperature of the policy preset and of budget-0 moves
    sampling: str | None = None  # None: the mode's own rule (see ``move_rule``)
    rating_based_elo: int = 2200  # "rating-based": argmax at or above this Elo after 8 plies
    rules: str = "standard"  # chess_jax rules for terminal detection inside the tree
    greedy_elo: int = 2500  # both header Elos in ``greedy`` mode
    max_path: int = 32  # P: deepest node of the tree (its keys/values are kept per node)
    resign_value: float = -0.9  # resign below this value (side to move) ...
    resign: bool = True  # ... when the termination logit also beats every legal move
    # Gumbel MuZero (``gumbel``: mean_sims each; ``gumbel-adaptive``: the time rule), see
    # search/gumbel.py. ``gumbel_transform="anchor"`` (default): π' = softmax(log anchor + q̂/λ)
    # with the λ above and no rescaling of q̂ (completed Q). "mctx": stock mctx,
    # π' = softmax(prior + σ(q̂)), σ min–max rescaled, so its λ is
    # (q_max − q_min) / ((gumbel_c_visit + max N) · gumbel_c_scale) and follows the spread of Q.
    gumbel_transform: str = "anchor"
    gumbel_c_scale: float = 0.1  # mctx's value_scale
    gumbel_c_visit: float = 50.0  # mctx's maxvisit_init
    gumbel_considered: int = 16  # actions sampled at the root (mctx's max_num_considered_actions)
    gumbel_noise: float = 1.0  # Gumbel noise scale (0: deterministic halving)
    # Leaves selected per game per search step (``virtual_loss``) and evaluated in one model call
    # (see search/tree_search.py); 1 is the plain one-leaf-per-step search.
    leaf_batch: int = 1
    # How a step's pending leaves steer its later selections (K > 1 only; one of VIRTUAL_LOSSES):
    # "visit" (lc0's in-flight visits) counts each as a visit in pUCT's exploration term only,
    # Q unchanged, so its moves stay closer to the one-leaf search's; "loss" (AlphaGo Zero's
    # virtual loss) as a lost visit.
    virtual_loss: str = "visit"

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, MODES)
        _check_choice("final_policy", self.final_policy, FINAL_POLICIES)
        _check_choice("fpu_mode", self.fpu_mode, FPU_MODES)
        _check_choice("rules", self.rules, RULES)
        _check_choice("lambda_schedule", self.lambda_schedule, LAMBDA_SCHEDULES)
        _check_choice("gumbel_transform", self.gumbel_transform, GUMBEL_TRANSFORMS)
        _check_choice("final_support", self.final_support, FINAL_SUPPORTS)
        _check_choice("selection", self.selection, SELECTIONS)
        _check_choice("virtual_loss", self.virtual_loss, VIRTUAL_LOSSES)
        if self.selection == "kl" and self.gumbel:
            raise ValueError(
                f"selection='kl' with mode={self.mode!r}: Gumbel modes select by sequential "
                "halving; KL selection is for the pUCT modes (search, adaptive)"
            )
        if self.sampling is not None:
            _check_choice("sampling", self.sampling, SAMPLING)
        if not 0 <= self.mean_sims <= self.max_sims:
            raise ValueError(
                f"mean_sims={self.mean_sims} must lie in [0, max_sims={self.max_sims}]"
            )
        if self.max_path < 1:
            raise ValueError(f"max_path={self.max_path} must be at least 1")
        if self.leaf_batch < 1:
            raise ValueError(f"leaf_batch={self.leaf_batch} must be at least 1")
        if self.gumbel_considered < 1:
            raise ValueError(f"gumbel_considered={self.gumbel_considered} must be at least 1")
        if self.gumbel_noise < 0 or self.gumbel_c_visit < 0:
            raise ValueError(
                f"gumbel_noise={self.gumbel_noise} and gumbel_c_visit={self.gumbel_c_visit} "
                "must not be negative"
            )
        for name in (
            "c_puct",
            "c_base",
            "sims_per_second",
            "temperature",
            "max_think_time",
            "gumbel_c_scale",
            "anchor_lambda",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SearchConfig:
        """The paper's presets: ``policy``, ``greedy``, ``search`` (50 sims), ``adaptive`` (mean 50),
        and Gumbel MuZero: ``gumbel`` (50 sims), ``gumbel-adaptive`` (mean 50)."""
        _check_choice("preset", name, MODES)
        return cls(mode=name, **overrides)

    @property
    def move_rule(self) -> str:
        """How the move is drawn from the final policy: greedy takes the argmax, others sample."""
        if self.sampling is not None:
            return self.sampling
        return "argmax" if self.mode == "greedy" else "sample"

    @property
    def searches(self) -> bool:
        return self.mode in SEARCH_MODES

    @property
    def adaptive(self) -> bool:
        """Budgets differ per game (the time rule): rows are sorted and packed by budget."""
        return self.mode in ADAPTIVE_MODES

    @property
    def gumbel(self) -> bool:
        return self.mode in ("gumbel", "gumbel-adaptive")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {list(choices)}")


# option names accepted for SearchConfig fields besides the fields' own names
OPTION_ALIASES = {"lambda": "anchor_lambda"}


def check_fields(names: Any) -> None:
    """Raise ValueError naming every one of ``names`` that is not a SearchConfig field (a caller's
    overrides, checked before they reach the dataclass's own TypeError)."""
    unknown = set(names) - {f.name for f in dataclasses.fields(SearchConfig)}
    if unknown:
        raise ValueError(f"SearchConfig has no field(s) {sorted(unknown)}")


def from_options(
    mode: str, options: Mapping[str, str], *, strict: bool = False, flag: str = "--system_options"
) -> SearchConfig:
    """``SearchConfig.preset(mode)`` with every ``key=value`` of ``options`` that names a field
    (or an ``OPTION_ALIASES`` name: ``lambda`` is ``anchor_lambda``) applied, cast from text to
    the field's type. The evaluator's systems share one option list with other factories, so
    other keys are skipped there; ``strict`` (``launch.match``) makes them an error. Every
    error is one line naming ``flag``, the key and the value."""
    fields = {f.name for f in dataclasses.fields(SearchConfig)}
    defaults = SearchConfig()
    overrides: dict[str, Any] = {}
    for key, text in options.items():
        field = OPTION_ALIASES.get(key, key)
        if field not in fields or field == "mode":
            if strict:
                raise ValueError(f"{flag} {key}={text!r}: not a SearchConfig field")
            continue
        default = getattr(defaults, field)
        try:
            if isinstance(default, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                value: Any = text.lower() in ("true", "1")
            elif default is None or isinstance(default, str):
                value = None if text in ("", "none", "None") else text
            else:
                value = type(default)(text)
        except ValueError:
            raise ValueError(
                f"{flag} {key}={text!r}: not a valid {type(default).__name__}"
            ) from None
        overrides[field] = value
    return SearchConfig.preset(mode, **overrides)
