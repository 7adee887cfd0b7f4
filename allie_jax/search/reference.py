"""A plain-Python MCTS (python-chess, one game, no batching) with the batched search's equations.

It is the independent second implementation for parity tests and, with ``FullSequenceEvaluator``,
the released design for the benchmark: every leaf evaluation re-reads the root prefix plus the
path through the model, with no cache.

Equations (as ``selection`` / ``tree_search`` / ``pibar``):
- node statistics from the view of the player to move at the node; a node's evaluation counts
  as its first visit (the root's too); Q(s, a) = −V(child);
- score(a) = Q(s, a) + (log((N(s) + c_base + 1) / c_base) + c) · sqrt(N(s)) · P(s, a) / (1 + N(s, a)),
  unvisited Q from first-play urgency; ties to the lowest move id;
- terminal nodes (mate: −1 for the side to move, draws 0) and nodes at depth ``max_path`` are
  never expanded: a revisit backs their value up again;
- π̄ by bisection in float64 on the completed Q.
- ``selection="kl"`` (``selection.make_kl_selection``): every node takes
  argmax_a π̄_s(a) − N(s, a)/(1 + ΣN(s)), π̄_s on Q completed by mctx's mixed value
  (V_raw(s) + ΣN · Σ_visited P·Q / Σ_visited P) / (ΣN + 1), anchor P(s, ·), constant λ;
  ``root_anchor`` (logits [1968]) replaces the anchor at the root (its softmax over the legal
  moves), as ``Searcher.run(anchor_logits=...)`` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import chess
import numpy as np

from allie_jax import vocab

# evaluate(moves_from_root_position) -> (move logits [1968], value for the side to move)
Evaluator = Callable[[Sequence[int]], tuple[np.ndarray, float]]


@dataclasses.dataclass
class Node:
    board: chess.Board
    path: tuple[int, ...]  # move ids from the search root
    prior: np.ndarray | None = None  # [1968], 0 off the legal set
    legal: np.ndarray | None = None  # move ids, ascending
    children: dict[int, Node] = dataclasses.field(default_factory=dict)
    visits: int = 0
    value_sum: float = 0.0
    terminal: bool = False
    raw_value: float = 0.0  # the node's own evaluation (exact value if terminal)

    @property
    def value(self) -> float:
        return self.value_sum / self.visits


def terminal_value(board: chess.Board, rules: str = "standard") -> float | None:
    """Exact value for the side to move, or None if the game goes on (chess_jax's rules)."""
    if board.is_checkmate():
        return -1.0
    if board.is_stalemate() or board.is_insufficient_material():
        return 0.0
    if rules == "released":
        if board.halfmove_clock >= 150 or board.is_repetition(5):
            return 0.0
    elif board.halfmove_clock >= 100 or board.is_repetition(3):
        return 0.0
    return None


def legal_ids(board: chess.Board) -> np.ndarray:
    return np.array(sorted(vocab.encode_move(m.uci()) for m in board.legal_moves), np.int64)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def pibar(q: np.ndarray, prior: np.ndarray, lam: float, iterations: int = 200) -> np.ndarray:
    """Grill et al.'s π̄ over the given (legal) entries, float64 bisection without shortcuts."""
    if lam <= 0:
        return prior.copy()
    lo, hi = float((q + lam * prior).max()), float(q.max() + lam)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if (lam * prior / np.maximum(mid - q, 1e-300)).sum() > 1.0:
            lo = mid
        else:
            hi = mid
    p = lam * prior / np.maximum(0.5 * (lo + hi) - q, 1e-300)
    return p / p.sum()


@dataclasses.dataclass
class ReferenceResult:
    visit_counts: np.ndarray  # [1968]
    q: np.ndarray  # [1968] completed Q at the root (mover's view), 0 off the legal set
    prior: np.ndarray  # [1968]
    policy: np.ndarray  # [1968] π̄ (or visits)
    root_value: float
    evaluations: int


class ReferenceMCTS:
    """One game's search. ``board`` is the root position (its move stack gives repetitions)."""

    def __init__(
        self,
        evaluate: Evaluator,
        *,
        c_puct: float = 1.25,
        c_base: float = 19652.0,
        fpu_mode: str = "reduction",
        fpu: float = 0.0,
        lambda_sqrt: bool = True,
        final_policy: str = "pibar",
        max_path: int = 32,
        rules: str = "standard",
        selection: str = "puct",
        anchor_lambda: float = 0.11,
        root_anchor: np.ndarray | None = None,
    ) -> None:
        if selection not in ("puct", "kl"):
            raise ValueError(f"selection={selection!r}: expected 'puct' or 'kl'")
        self.selection, self.anchor_lambda = selection, anchor_lambda
        self.root_anchor = root_anchor
        self.evaluate = evaluate
        self.c_puct, self.c_base = c_puct, c_base
        self.fpu_mode, self.fpu = fpu_mode, fpu
        self.lambda_sqrt, self.final_policy = lambda_sqrt, final_policy
        self.max_path, self.rules = max_path, rules
        self.evaluations = 0

    def _expand(self, node: Node) -> float:
        exact = terminal_value(node.board, self.rules)
        if exact is not None:
            node.terminal = True
            node.raw_value = exact
            return exact
        logits, value = self.evaluate(node.path)
        self.evaluations += 1
        node.legal = legal_ids(node.board)
        node.prior = np.zeros(vocab.NUM_MOVES)
        node.prior[node.legal] = _softmax(np.asarray(logits, np.float64)[node.legal])
        node.raw_value = float(value)
        return float(value)

    def _q(self, node: Node, move: int) -> float:
        child = node.children.get(move)
        if child is not None and child.visits > 0:
            return -child.value
        return self.fpu if self.fpu_mode == "absolute" else node.value - self.fpu

    def _select_kl(self, node: Node) -> int:
        legal = [int(m) for m in node.legal]
        prior = node.prior[node.legal]
        visits = np.array([node.children[m].visits if m in node.children else 0 for m in legal])
        q = np.array(
            [-node.children[m].value if v > 0 else 0.0 for m, v in zip(legal, visits, strict=True)]
        )
        seen = visits > 0
        total = float(visits.sum())
        weighted = (prior[seen] * q[seen]).sum() / prior[seen].sum() if seen.any() else 0.0
        mixed = (node.raw_value + total * weighted) / (total + 1.0)
        q = np.where(seen, q, mixed)
        anchor = prior  # the mixed value above weighs by the model's prior, π̄ by the anchor
        if self.root_anchor is not None and not node.path:
            anchor = _softmax(np.asarray(self.root_anchor, np.float64)[node.legal])
        score = pibar(q, anchor, self.anchor_lambda) - visits / (1.0 + total)
        return legal[int(np.argmax(score))]  # the first maximum: ties to the lowest id

    def _select(self, node: Node, c: float) -> int:
        if self.selection == "kl":
            return self._select_kl(node)
        n = node.visits
        factor = (math.log((n + self.c_base + 1) / self.c_base) + c) * math.sqrt(n)
        best, best_score = -1, -math.inf
        for move in node.legal:  # ascending ids: ties go to the lowest
            child = node.children.get(int(move))
            visits = child.visits if child is not None else 0
            score = self._q(node, int(move)) + factor * node.prior[move] / (1 + visits)
            if score > best_score:
                best, best_score = int(move), score
        return best

    def run(self, board: chess.Board, num_sims: int, c: float | None = None) -> ReferenceResult:
        c = self.c_puct if c is None else c
        root = Node(board.copy(), ())
        if terminal_value(root.board, self.rules) is not None:
            raise ValueError("the root position is terminal")
        root.value_sum, root.visits = self._expand(root), 1
        for _ in range(num_sims):
            node, path = root, [root]
            while True:
                if node.terminal or len(node.path) >= self.max_path:
                    leaf_value = node.value  # revisit of a frozen node
                    break
                move = self._select(node, c)
                child = node.children.get(move)
                if child is None:
                    nb = node.board.copy(stack=True)
                    nb.push(chess.Move.from_uci(vocab.decode_move(move)))
                    child = node.children[move] = Node(nb, node.path + (move,))
                    path.append(child)
                    leaf_value = self._expand(child)
                    break
                node = child
                path.append(node)
            for n in reversed(path):
                n.visits += 1
                n.value_sum += leaf_value
                leaf_value = -leaf_value
        visits = np.zeros(vocab.NUM_MOVES)
        q = np.zeros(vocab.NUM_MOVES)
        for move in root.legal:
            child = root.children.get(int(move))
            visits[move] = child.visits if child is not None else 0
            q[move] = self._q(root, int(move))
        total = visits.sum()
        legal = root.legal
        if num_sims == 0:
            policy = root.prior.copy()
        elif self.final_policy == "visits":
            policy = visits / total
        else:
            scale = math.sqrt(total) if self.lambda_sqrt else total
            lam = c * scale / (len(legal) + total)
            policy = np.zeros(vocab.NUM_MOVES)
            policy[legal] = pibar(q[legal], root.prior[legal], lam)
        return ReferenceResult(visits, q, root.prior, policy, root.value, self.evaluations)


class FullSequenceEvaluator:
    """The released design's leaf evaluation: model(root prefix + path), whole sequence, no cache.

    ``forward(tokens int32 [1, T]) -> (policy_logits [1968], value_white)`` at the last position;
    ``root_tokens`` is the game's prefix and ``white_to_move`` the side to move at the root.
    """

    def __init__(self, forward, root_tokens: Sequence[int], white_to_move: bool) -> None:
        self.forward = forward
        self.root_tokens = list(root_tokens)
        self.white_to_move = white_to_move
        self.tokens_computed = 0

    def __call__(self, path: Sequence[int]) -> tuple[np.ndarray, float]:
        tokens = self.root_tokens + list(path)
        self.tokens_computed += len(tokens)
        logits, value_white = self.forward(tokens)
        white = self.white_to_move == (len(path) % 2 == 0)
        return np.asarray(logits)[: vocab.NUM_MOVES], float(value_white if white else -value_white)


def whole_sequence_forward(model, multiple: int = 16) -> Callable[[Sequence[int]], tuple]:
    """``FullSequenceEvaluator``'s ``forward`` for a decoder: the model on the whole token
    sequence (padded to a multiple of ``multiple``, so few lengths compile), the last
    position's policy logits and value. The released design's leaf call, for the oracle and the
    benchmark's baseline alike."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params = nnx.split(model)

    @functools.partial(jax.jit, static_argnames=("graphdef",))
    def fwd(graphdef, params, tokens, last):
        out = nnx.merge(graphdef, params)(tokens)
        return out.policy_logits[0, last], out.value[0, last]

    def forward(tokens: Sequence[int]) -> tuple[np.ndarray, float]:
        n = len(tokens)
        padded = np.full((1, -(-n // multiple) * multiple), vocab.PAD, np.int32)
        padded[0, :n] = tokens
        logits, value = fwd(graphdef, params, jnp.asarray(padded), n - 1)
        return np.asarray(logits), float(value)

    return forward
