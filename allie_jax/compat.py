"""Every private API of a dependency this project uses, in one place.

A JAX or Flax upgrade that moves one of these breaks here, in one file, with the name of what
moved, instead of somewhere deep in a training step. Each entry says why no public API serves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any


def cudnn_fused_attention() -> tuple[Any, Any]:
    """(``dot_product_attention``, ``MaskType``) of JAX's cuDNN fused attention.

    ``jax.nn.dot_product_attention`` has no packed (several sequences per row) layout; the
    cuDNN module's own ``dot_product_attention`` takes per-segment lengths and offsets.
    """
    from jax._src.cudnn import fused_attention_stablehlo as fa

    return fa.dot_product_attention, fa.MaskType


def cudnn_fix_seqlen_offsets(q_seqlen, kv_seqlen, q_offsets, kv_offsets, query, key):
    """JAX's own compaction of packed ``[B, M]`` lengths / ``[B, M + 1]`` offsets into the flat
    per-segment arrays cuDNN reads (run before every packed cuDNN call). Tests run it on our
    layout to check that every segment lands on its own tokens, the way the GPU will read it."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    return fa._fix_seqlen_offsets(q_seqlen, kv_seqlen, q_offsets, kv_offsets, query, key)


def jax_backends_started() -> bool:
    """True once JAX has created a backend. No public API asks without starting one
    (``jax.devices()`` would), and ``host_memory`` must act before that happens."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(xla_bridge is not None and getattr(xla_bridge, "_backends", None))


def jax_compiler_module() -> Any:
    """``jax._src.compiler``, whose ``_cache_read`` hook ``aot`` bypasses for one compile
    (an executable JAX's persistent cache deserialized cannot be serialized again)."""
    from jax._src import compiler

    return compiler


@contextlib.contextmanager
def cudnn_compute_capability(capability: str) -> Iterator[None]:
    """While tracing, JAX's cuDNN attention asks the compile target (compute ``capability``,
    e.g. "9.0") what it supports instead of this host.

    ``fused_attention_stablehlo.check_is_flash_attention`` decides at trace time whether the
    packed (segment) layout is allowed by calling ``check_compute_capability``, which reads the
    compute capability of the *host's* default backend. Compiling for an H100 from a CPU host
    (``allie_jax.compile_check``) stops there with "Packed layout requires a GPU with at least
    Hopper architecture", although XLA then compiles the cuDNN call for the target without a
    device. Inside this block both capability checks answer for ``capability``; restored on exit.
    """
    from jax._src.cudnn import fused_attention_stablehlo as fa

    target = _capability(capability)
    saved = fa.check_compute_capability, fa.is_cuda_compute_capability_equal
    fa.check_compute_capability = lambda c: target >= _capability(c)
    fa.is_cuda_compute_capability_equal = lambda c: target == _capability(c)
    try:
        yield
    finally:
        fa.check_compute_capability, fa.is_cuda_compute_capability_equal = saved


def load_serialized_executable(payload: bytes) -> tuple[Any, list, bool]:
    """The first half of ``jax.experimental.serialize_executable.deserialize_and_load``: the
    executable in ``payload`` (``serialize``'s bytes) loaded onto the default backend, with its
    flat argument infos and its ``no_kwargs`` flag; ``compiled_from_loaded`` is the second half.

    ``deserialize_and_load`` needs the input and output tree definitions up front, and
    unpickling those imports the modules their node types live in; split, the costly part (XLA
    loading the machine code, which releases the GIL) runs in a thread before those modules are
    imported (``aot``'s read-ahead at engine start), and the trees are read later.
    """
    import io

    import jax
    from jax.experimental import serialize_executable

    backend = jax.devices()[0].client
    unpickler = serialize_executable._JaxPjrtUnpickler(io.BytesIO(payload), backend)
    unloaded, args_info_flat, no_kwargs = unpickler.load()
    return unloaded.load(), args_info_flat, no_kwargs


def compiled_from_loaded(loaded: Any, args_info: Any, out_tree: Any, no_kwargs: bool) -> Any:
    """A ``jax.stages.Compiled`` around an executable of ``load_serialized_executable``, as
    ``deserialize_and_load`` builds it."""
    import jax

    return jax.stages.Compiled(loaded, [], args_info, out_tree, no_kwargs=no_kwargs)


def _capability(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


# ------------------------------------------------------------------ pinned private modules
# Each private module below is read at exactly the version pyproject.toml pins; another version
# stops with the name of what to check instead of a wrong tree or board deep inside a search.
PINNED = {"mctx": "0.0.71", "pgx": "2.6.0", "chess": "1.11.2"}


def _pinned(package: str) -> None:
    from importlib import metadata

    have = metadata.version(package)
    if have != PINNED[package]:
        raise ImportError(
            f"{package} {have} is installed; allie_jax reads {package}'s private modules as of "
            f"{PINNED[package]} (allie_jax/compat.py): install {package}=={PINNED[package]}"
        )


def mctx_search_module() -> Any:
    """``mctx._src.search``: ``instantiate_tree_from_root``, the tree layout ``mctx.search``
    starts from. mctx exports ``search`` but not its building blocks, and the batched search
    (``search/tree_search.py``) runs mctx's loop with per-game budgets on the same tree."""
    _pinned("mctx")
    from mctx._src import search

    return search


def mctx_seq_halving() -> Any:
    """``mctx._src.seq_halving``: Gumbel MuZero's sequential-halving schedule and root score,
    which ``mctx.gumbel_muzero_policy`` uses inside and does not export."""
    _pinned("mctx")
    from mctx._src import seq_halving

    return seq_halving


class _ModuleOnFirstUse:
    """A module imported at its first attribute access instead of where it is named.

    ``load`` runs once (the import system's lock makes a second thread wait for the first)."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self.__dict__["_load"] = load
        self.__dict__["_module"] = None

    def __getattr__(self, name: str) -> Any:
        module = self.__dict__["_module"]
        if module is None:
            module = self.__dict__["_module"] = self.__dict__["_load"]()
        return getattr(module, name)


def _import_pgx_chess() -> Any:
    _pinned("pgx")
    import jax

    # pgx builds its move tables with eager JAX at import; the first use may come while a caller
    # traces (chess_jax inside jit), where those operations would be staged into that trace and
    # the tables would be tracers: they run eagerly, whatever is being traced
    with jax.ensure_compile_time_eval():
        from pgx._src.games import chess
    return chess


_PGX_CHESS = _ModuleOnFirstUse(_import_pgx_chess)


def pgx_chess() -> Any:
    """``pgx._src.games.chess``: pgx's jittable chess state, move application and attack tests
    (``_apply_move``, ``_is_attacked``, ``_is_checked``, the move tables). pgx's public ``Chess``
    env steps whole environments with its own observation; ``chess_jax`` needs the rules alone.

    Imported at its first use, not when ``chess_jax`` is: it builds its tables with eager JAX at
    import, which an engine starting from stored executables (``aot``) never needs, since it
    traces no chess rules (what that saves: bench/RESULTS.md)."""
    return _PGX_CHESS


_CHESS_CHECKED: list[bool] = []  # python-chess's version is checked once per process


def chess_transposition_key(board: Any) -> Any:
    """python-chess's ``Board._transposition_key()``: what its repetition rules compare (pieces,
    side to move, castling rights, a capturable en-passant square). python-chess answers
    "is this a repetition" but does not expose the key, and the board features count every
    position of a game as they walk it instead of asking the board once per position."""
    if not _CHESS_CHECKED:
        _pinned("chess")
        _CHESS_CHECKED.append(True)
    return board._transposition_key()
