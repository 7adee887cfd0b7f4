"""Stream PGN files into ``Game`` records, counting every game it cannot use by reason.

The released code parsed each game with python-chess's ``read_game`` (a full visitor building a
node tree) and then walked the mainline reading ``node.clock()``. We do less: split the stream into
games by scanning lines, read headers with one regex, read the move text a ply per regex match
(``_read_moves_fast``; ``_read_moves`` handles variations, NAGs and other rare syntax) and resolve
each SAN with ``allie_jax.san.SanBoard``, a mailbox board that leaves only the unusual moves to
python-chess. That is faster (bench/pgn.py, figures in bench/RESULTS.md) and lets us count
exactly why a game was
skipped instead of relying on the visitor's error list.

Robustness rules (the fuzz test in tests/test_pgn.py checks them): a game boundary is a
well-formed header line once the current game has move text, or after the header block was
closed by a blank line, or when a header tag repeats; a game is complete when its move text ends
with a result token outside a comment. So a broken game can only lose itself, never its
neighbours.
"""

from __future__ import annotations

import bz2
import dataclasses
import hashlib
import io
import itertools
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import IO

import chess

from allie_jax import vocab
from allie_jax.game import NO_TIME, Game
from allie_jax.san import SanBoard


class PGNError(RuntimeError):
    """An input that cannot be read at all (missing file, bad compression, not text)."""


# Reasons a game is skipped; stats.dropped uses these keys (prepare adds filter reasons).
DROP_REASONS = (
    "bad_header",  # malformed header line, malformed Elo/Result, or no headers at all
    "unfinished_result",  # Result "*"
    "bad_time_control",  # TimeControl "-", "0+1", "1/86400", garbage
    "unparsable_move",  # move text token that is not SAN / number / comment / result
    "illegal_move",  # SAN that is not legal (or ambiguous) in the position
    "no_moves",
    "truncated",  # input ended (or the next game began) before the result token
    "no_clocks",  # only when require_clocks: some move lacks a [%clk]
    "unsupported_variant",  # Variant / SetUp headers for a non-standard start
)

LICHESS_TERMINATIONS = ("Normal", "Time forfeit", "Abandoned", "Rules infraction")


@dataclasses.dataclass
class ParseStats:
    games_read: int = 0
    games_ok: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def merge(self, other: ParseStats) -> None:
        self.games_read += other.games_read
        self.games_ok += other.games_ok
        for reason, count in other.dropped.items():
            self.drop(reason, count)

    def to_dict(self) -> dict:
        return {
            "games_read": self.games_read,
            "games_ok": self.games_ok,
            "dropped": dict(sorted(self.dropped.items())),
        }


@dataclasses.dataclass
class ParsedGame:
    """A game plus the headers that filters need but ``Game`` does not carry (Event, titles)."""

    game: Game
    headers: dict[str, str]


class GameRejected(ValueError):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Opening inputs


class InputStatus:
    """What reading one input found beyond its games: a compressed stream cut short."""

    __slots__ = ("name", "truncated", "bytes_read")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.truncated = False  # the compressed stream ended inside a frame / stream
        self.bytes_read = 0  # decompressed bytes delivered


def _open_binary(path: str) -> IO[bytes]:
    """A binary stream for a local or remote (etils.epath) path; PGNError when it cannot open."""
    from etils import epath

    try:
        if "://" in path:
            return epath.Path(path).open("rb")
        return open(path, "rb")  # noqa: SIM115 - returned to the caller
    except (OSError, ValueError) as e:
        raise PGNError(
            f"cannot open PGN input {path!r}: {getattr(e, 'strerror', None) or e}"
        ) from e


def iter_bytes(
    source: str | os.PathLike, status: InputStatus | None = None, block_size: int = 1 << 20
) -> Iterator[bytes]:
    """Decompressed bytes of a .pgn / .pgn.zst / .pgn.bz2 path (local or remote), block by block.

    A compressed stream that ends inside a frame (a cut download) is not an error here: every
    byte before the cut comes out, ``status.truncated`` is set and a warning names the input;
    the game it cut is then counted as ``truncated`` by the parser. An input that is not the
    compression its name says, or not readable at all, raises ``PGNError`` naming it.
    """
    path = os.fspath(source)
    status = status if status is not None else InputStatus(path)
    raw = _open_binary(path)
    try:
        if path.endswith(".zst"):
            blocks = _zstd_blocks(raw, path, status, block_size)
        elif path.endswith(".bz2"):
            blocks = _bz2_blocks(raw, path, status, block_size)
        else:
            blocks = iter(lambda: raw.read(block_size), b"")
        for block in blocks:
            status.bytes_read += len(block)
            yield block
    except OSError as e:
        raise PGNError(f"cannot read PGN input {path!r}: {e}") from e
    finally:
        raw.close()
    if status.truncated:
        import logging

        logging.getLogger(__name__).warning(
            "%s: the compressed stream is cut short after %d bytes (truncated download?); "
            "the games before the cut are read, the cut game is counted as 'truncated'",
            path,
            status.bytes_read,
        )


def _zstd_blocks(raw: IO[bytes], path: str, status: InputStatus, size: int) -> Iterator[bytes]:
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    d = dctx.decompressobj()
    in_frame = False
    while data := raw.read(size):
        while data:
            try:
                out = d.decompress(data)
            except zstandard.ZstdError as e:
                raise PGNError(f"cannot read PGN input {path!r}: not valid zstd data ({e})") from e
            in_frame = True
            if out:
                yield out
            if d.eof:  # a frame ended; the next one (concatenated frames) starts fresh
                data = d.unused_data
                d = dctx.decompressobj()
                in_frame = False
            else:
                data = b""
    status.truncated = in_frame


def _bz2_blocks(raw: IO[bytes], path: str, status: InputStatus, size: int) -> Iterator[bytes]:
    d = bz2.BZ2Decompressor()
    in_stream = False
    while data := raw.read(size):
        while data:
            try:
                out = d.decompress(data)
            except OSError as e:
                raise PGNError(f"cannot read PGN input {path!r}: not valid bz2 data ({e})") from e
            in_stream = True
            if out:
                yield out
            if d.eof:
                data = d.unused_data
                d = bz2.BZ2Decompressor()
                in_stream = False
            else:
                data = b""
    status.truncated = in_stream


class _BlockReader(io.RawIOBase):
    """A raw binary stream over an iterator of byte blocks (for TextIOWrapper)."""

    def __init__(self, blocks: Iterator[bytes]):
        self._blocks = blocks
        self._pending = memoryview(b"")  # a view: handing out a block copies nothing twice

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not len(self._pending):
            block = next(self._blocks, None)
            if block is None:
                return 0
            self._pending = memoryview(block)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def text_from_bytes(blocks: Iterable[bytes]) -> IO[str]:
    """Text (UTF-8, bad bytes replaced, universal newlines) over byte blocks."""
    raw = _BlockReader(iter(blocks))
    return io.TextIOWrapper(io.BufferedReader(raw, 1 << 20), encoding="utf-8", errors="replace")


def open_text(source: str | os.PathLike | IO[str], status: InputStatus | None = None) -> IO[str]:
    """A text stream for a path (.pgn, .pgn.zst, .pgn.bz2; local or remote), "-" (stdin) or an
    open text stream."""
    if isinstance(source, io.TextIOBase) or hasattr(source, "readline"):
        return source  # type: ignore[return-value]
    if str(source) == "-":
        return sys.stdin
    path = os.fspath(source)
    blocks = iter_bytes(path, status)
    try:
        first = next(blocks, b"")  # open now, so a missing file fails here, naming it
    except BaseException:
        blocks.close()
        raise
    return text_from_bytes(itertools.chain([first], blocks))


def lines(source: str | os.PathLike | IO[str], status: InputStatus | None = None) -> Iterator[str]:
    name = source if isinstance(source, str | os.PathLike) else getattr(source, "name", "<stream>")
    stream = open_text(source, status)
    try:
        while True:
            try:
                line = stream.readline()
            except (OSError, EOFError, ValueError) as e:  # decoding errors of a plain stream
                raise PGNError(f"cannot read PGN input {os.fspath(name)!r}: {e}") from e
            if not line:
                return
            yield line
    finally:
        if stream is not source and stream is not sys.stdin:
            stream.close()


# ---------------------------------------------------------------------------------------------
# Splitting a stream into games

HEADER_RE = re.compile(r'^\[([A-Za-z0-9_]+)\s+"((?:[^"\\]|\\.)*)"\]\s*$')
_RESULT_END_RE = re.compile(r"(?:1-0|0-1|1/2-1/2|\*)\s*$")


def _brace_delta(line: str, depth: int) -> int:
    """Comment depth (0 or 1: {...} comments do not nest in PGN) after ``line``."""
    if depth:
        close = line.find("}")
        if close < 0:
            return 1
        line = line[close + 1 :]
    opened = line.rfind("{")
    return 1 if opened >= 0 and line.find("}", opened) < 0 else 0


class RawGame:
    """One game's text as split from the stream; ``complete`` is False when it ended early."""

    __slots__ = ("header_lines", "move_lines", "complete")

    def __init__(self) -> None:
        self.header_lines: list[str] = []
        self.move_lines: list[str] = []
        self.complete = False

    def text(self) -> str:
        return "".join(self.header_lines) + "\n" + "".join(self.move_lines)


def split_games(lines: Iterable[str]) -> Iterator[RawGame]:
    """Group lines into games without parsing moves (cheap; runs in the reading process)."""
    game: RawGame | None = None
    tags: set[str] = set()
    blank_after_headers = False
    depth = 0
    for line in lines:
        stripped = line.strip()
        if not stripped:
            if game is not None and game.header_lines and not game.move_lines:
                blank_after_headers = True
            continue
        m = HEADER_RE.match(stripped) if stripped[0] == "[" else None
        if m is not None:
            new_game = game is None or (
                bool(game.move_lines) or blank_after_headers or m.group(1) in tags
            )
            if new_game:
                if game is not None:
                    yield game
                game = RawGame()
                tags = set()
                blank_after_headers = False
                depth = 0
            assert game is not None
            game.header_lines.append(line)
            tags.add(m.group(1))
            continue
        if game is None or (game.complete and depth == 0):
            if game is not None:
                yield game
            game = RawGame()
            tags = set()
            blank_after_headers = False
            depth = 0
        if not game.move_lines and stripped[0] == "[" and not blank_after_headers:
            game.header_lines.append(line)  # a malformed header line: the game is bad_header
            continue
        game.move_lines.append(line)
        depth = _brace_delta(stripped, depth)
        if depth == 0 and _RESULT_END_RE.search(stripped):
            # The result must be its own token (not the tail of "e4*"); check the char before it.
            game.complete = _result_is_token(stripped)
    if game is not None:
        yield game


def _result_is_token(line: str) -> bool:
    m = _RESULT_END_RE.search(line)
    assert m is not None
    start = m.start()
    return start == 0 or line[start - 1] in " \t}).\n"


# ---------------------------------------------------------------------------------------------
# Parsing one game

# Move text splits into comments, parentheses, line comments and whitespace-separated words;
# words are then told apart by their first character (cheaper than one regex group per kind).
_WORD_RE = re.compile(r"\{[^}]*\}?|;[^\n]*|[()]|[^\s{}();]+")
_NUMBER_RE = re.compile(r"^\d+\.+")
_RESULT_TOKENS = frozenset(("1-0", "0-1", "1/2-1/2", "*"))
_CLK_RE = re.compile(r"\[%clk\s+(\d+):(\d{1,2}):(\d{1,2}(?:\.\d*)?)\s*\]")
_TC_RE = re.compile(r"^(\d+)(?:\+(\d+))?$")
_ELO_RE = re.compile(r"^\d{1,4}$")
_RESULTS = {"1-0": 1.0, "0-1": -1.0, "1/2-1/2": 0.0}


_SAN_RE = re.compile(
    r"^(?:[NBRQK]?[a-h]?[1-8]?x?[a-h][1-8](?:=?[NBRQnbrq])?|O-O-O|O-O|0-0-0|0-0)[+#]?$"
)


def parse_time_control(tc: str) -> tuple[int, int] | None:
    """(base, increment) seconds, or None for "-", "0+1", daily "1/86400" and garbage."""
    m = _TC_RE.match(tc.strip())
    if m is None:
        return None
    base, inc = int(m.group(1)), int(m.group(2) or 0)
    if base <= 0:
        return None
    return base, inc


def normalize_termination(value: str | None) -> str:
    """Lichess terminations unchanged; chess.com's sentences mapped onto Lichess's classes."""
    if value is None:
        return "other"
    if value in LICHESS_TERMINATIONS:
        return value
    text = value.lower()
    if "abandon" in text:
        return "Abandoned"
    if "on time" in text or "timeout" in text:
        return "Time forfeit"  # "won on time", "drawn by timeout vs insufficient material"
    if any(
        w in text
        for w in (
            "resignation",
            "checkmate",
            "agreement",
            "repetition",
            "stalemate",
            "insufficient material",
            "50-move",
            "fifty",
        )
    ):
        return "Normal"
    if "rules infraction" in text or "fair play" in text:
        return "Rules infraction"
    return "other"


def _game_id(headers: dict[str, str], move_text: str) -> str:
    if gid := headers.get("GameId"):
        return gid
    site = headers.get("Site", "")
    if "lichess.org/" in site:
        return site.rsplit("/", 1)[-1][:8]
    link = headers.get("Link", "")
    if "chess.com" in link:
        return "chesscom:" + link.rstrip("/").rsplit("/", 1)[-1]
    # No stable id: a digest of the identifying headers and the moves (same game -> same split).
    key = "|".join(
        headers.get(k, "") for k in ("Site", "Date", "UTCDate", "UTCTime", "White", "Black")
    )
    return "sha1:" + hashlib.sha1((key + "|" + move_text).encode()).hexdigest()[:16]


def parse_elo(value: str | None) -> int | None:
    if value is None or value in ("?", "-", ""):
        return None
    if not _ELO_RE.match(value):
        raise GameRejected("bad_header", f"Elo {value!r}")
    return int(value)


def parse_game(raw: RawGame, *, require_clocks: bool = False) -> ParsedGame:
    """Parse one split game; raises ``GameRejected`` with the drop reason."""
    headers: dict[str, str] = {}
    for line in raw.header_lines:
        m = HEADER_RE.match(line.strip())
        if m is None:
            raise GameRejected("bad_header", line.strip()[:80])
        headers[m.group(1)] = m.group(2)
    if not headers:
        raise GameRejected("bad_header", "no headers")
    result_str = headers.get("Result")
    if result_str == "*":
        raise GameRejected("unfinished_result")
    if result_str not in _RESULTS:
        raise GameRejected("bad_header", f"Result {result_str!r}")
    white_elo = parse_elo(headers.get("WhiteElo"))
    black_elo = parse_elo(headers.get("BlackElo"))
    variant = headers.get("Variant", "Standard")
    if variant.lower() not in ("standard", "chess", "") or headers.get("SetUp") == "1":
        raise GameRejected("unsupported_variant", variant)
    tc_str = headers.get("TimeControl")
    time_control: str | None = None
    base_inc: tuple[int, int] | None = None
    if tc_str is not None:
        base_inc = parse_time_control(tc_str)
        if base_inc is None:
            raise GameRejected("bad_time_control", tc_str)
        time_control = vocab.normalize_time_control(tc_str)
    if not raw.complete:
        raise GameRejected("truncated")

    move_text = "".join(raw.move_lines)
    parsed_moves = _read_moves_fast(move_text)
    if parsed_moves is None:
        parsed_moves = _read_moves(move_text)
    moves, clocks = parsed_moves

    has_clock = [c >= 0 for c in clocks]
    if require_clocks and not all(has_clock):
        raise GameRejected("no_clocks")
    game = Game(
        moves=moves,
        white_elo=white_elo,
        black_elo=black_elo,
        time_control=time_control,
        result=_RESULTS[result_str],
        termination=normalize_termination(headers.get("Termination")),
        think_times=_think_times(clocks, base_inc) if any(has_clock) else None,
        clocks=clocks if any(has_clock) else None,
        game_id=_game_id(headers, move_text),
        white=headers.get("White", ""),
        black=headers.get("Black", ""),
    )
    return ParsedGame(game, headers)


def _read_moves(move_text: str) -> tuple[list[str], list[float]]:
    """The general move-text reader: variations, NAGs, any comments; raises ``GameRejected``."""
    board = SanBoard()
    moves = board.history
    clocks: list[float] = []
    depth = 0  # variation depth: moves inside ( ... ) are skipped
    result_token: str | None = None
    for word in _WORD_RE.findall(move_text):
        first = word[0]
        if first == "{":
            if word[-1] != "}":
                raise GameRejected("unparsable_move", "unclosed comment")
            if depth or not moves or result_token is not None:
                continue
            c = _CLK_RE.search(word)
            if c is not None:
                clocks[-1] = int(c.group(1)) * 3600 + int(c.group(2)) * 60 + float(c.group(3))
            continue
        if first == ";" or first == "$":
            continue
        if result_token is not None:
            raise GameRejected("unparsable_move", f"text after result: {word[:20]!r}")
        if first == "(":
            if not moves:
                raise GameRejected("unparsable_move", "variation before the first move")
            depth += 1
            continue
        if first == ")":
            if not depth:
                raise GameRejected("unparsable_move", "unbalanced ')'")
            depth -= 1
            continue
        if word in _RESULT_TOKENS:
            if depth:
                raise GameRejected("unparsable_move", "result inside a variation")
            result_token = word
            continue
        if first.isdigit() and not word.startswith("0-0"):
            num = _NUMBER_RE.match(word)
            if num is None:
                raise GameRejected("unparsable_move", word[:20])
            word = word[num.end() :]
            if not word:
                continue
        if depth:
            continue
        san = word.rstrip("!?")
        if not _SAN_RE.match(san):
            raise GameRejected("unparsable_move", word[:20])
        _push(board, san)
        clocks.append(NO_TIME)
    if result_token is None or depth:
        raise GameRejected("truncated")
    if not moves:
        raise GameRejected("no_moves")
    return moves, clocks


def _push(board: SanBoard, san: str) -> None:
    try:
        board.push_san(san)
    except chess.IllegalMoveError as e:
        raise GameRejected("illegal_move", f"{san} at ply {len(board.history) + 1}") from e
    except chess.InvalidMoveError as e:
        raise GameRejected("unparsable_move", san) from e
    except ValueError as e:  # AmbiguousMoveError
        raise GameRejected("illegal_move", f"{san} at ply {len(board.history) + 1}") from e


# The fast reader covers move text made only of "[number.] SAN [{comment}]" plies and a final
# result (every Lichess and chess.com export). It reads a ply per regex match and caches what a
# word and a comment mean; anything else (variations, NAGs, several comments in a row, a bad
# move) makes it give up, and ``_read_moves`` reads the game from the start, so both readers
# always agree (tests/test_pgn.py checks it on real and fuzzed games).
_PLY_RE = re.compile(r"(?:\d+\.+\s*)?([^\s{}();]+)\s*(\{[^}]*\})?")
_WORD_CACHE: dict[str, str | None] = {}  # word -> SAN without "!?", or None: not a plain SAN
_CLOCK_CACHE: dict[str, float] = {}  # comment -> its [%clk] in seconds, or NO_TIME
_CACHE_MAX = 200_000


def _word_san(word: str) -> str | None:
    if word in _RESULT_TOKENS or (word[0].isdigit() and not word.startswith("0-0")):
        return None
    san = word.rstrip("!?")
    return san if _SAN_RE.match(san) else None


def _comment_clock(comment: str) -> float:
    c = _CLK_RE.search(comment)
    if c is None:
        return NO_TIME
    return int(c.group(1)) * 3600 + int(c.group(2)) * 60 + float(c.group(3))


def _read_moves_fast(move_text: str) -> tuple[list[str], list[float]] | None:
    """(moves, clocks) for plain move text, or None to leave the game to ``_read_moves``."""
    if "(" in move_text or ")" in move_text or ";" in move_text:
        return None
    plies = _PLY_RE.findall(move_text)
    if len(plies) < 2:
        return None
    last_word, last_comment = plies.pop()
    if last_word not in _RESULT_TOKENS:
        return None
    comments = 1 if last_comment else 0
    board = SanBoard()
    push = board.push_san
    clocks: list[float] = []
    word_cache = _WORD_CACHE
    clock_cache = _CLOCK_CACHE
    try:
        for word, comment in plies:
            san = word_cache.get(word, False)
            if san is False:
                san = _word_san(word)
                if len(word_cache) >= _CACHE_MAX:
                    word_cache.clear()
                word_cache[word] = san
            if san is None:
                return None
            push(san)
            if comment:
                comments += 1
                clock = clock_cache.get(comment)
                if clock is None:
                    clock = _comment_clock(comment)
                    if len(clock_cache) >= _CACHE_MAX:
                        clock_cache.clear()
                    clock_cache[comment] = clock
                clocks.append(clock)
            else:
                clocks.append(NO_TIME)
    except ValueError:  # python-chess's move errors: _read_moves words the rejection
        return None
    if comments != move_text.count("{"):
        return None
    return board.history, clocks


def _think_times(clocks: list[float], base_inc: tuple[int, int] | None) -> list[float]:
    """SPEC §1: previous clock − current clock + increment; the first previous clock is the base.

    Negative values (clock glitches, berserk) and moves next to a missing clock stay unlabelled.
    Without a known time control nothing can be labelled.
    """
    if base_inc is None:
        return [NO_TIME] * len(clocks)
    base, inc = base_inc
    prev = [float(base), float(base)]
    times = []
    for i, clock in enumerate(clocks):
        side = i & 1
        before = prev[side]
        if clock < 0 or before < 0:
            times.append(NO_TIME)
        else:
            t = before - clock + inc
            times.append(t if t >= 0 else NO_TIME)
        prev[side] = clock
    return times


# ---------------------------------------------------------------------------------------------
# Public entry points


def iter_parsed(
    source: str | os.PathLike | IO[str],
    *,
    require_clocks: bool = False,
    stats: ParseStats | None = None,
    status: InputStatus | None = None,
) -> Iterator[ParsedGame]:
    """Like ``read_games`` but keeps the headers (prepare's filters read Event and titles)."""
    stats = stats if stats is not None else ParseStats()
    status = status if status is not None else InputStatus(str(source))
    previous: RawGame | None = None
    for raw in split_games(lines(source, status)):
        if previous is not None:
            yield from _parse_counted(previous, require_clocks, stats)
        previous = raw
    if previous is not None:
        if status.truncated:  # the stream was cut: its last game is incomplete, whatever it says
            stats.games_read += 1
            stats.drop("truncated")
        else:
            yield from _parse_counted(previous, require_clocks, stats)


def _parse_counted(raw: RawGame, require_clocks: bool, stats: ParseStats) -> Iterator[ParsedGame]:
    stats.games_read += 1
    try:
        parsed = parse_game(raw, require_clocks=require_clocks)
    except GameRejected as e:
        stats.drop(e.reason)
        return
    stats.games_ok += 1
    yield parsed


def read_games(
    source: str | os.PathLike | IO[str],
    *,
    require_clocks: bool = False,
    stats: ParseStats | None = None,
) -> Iterator[Game]:
    """Stream games from a path (.pgn/.pgn.zst/.pgn.bz2), "-" (stdin) or a text stream.

    Bad games are counted in ``stats.dropped[reason]`` and skipped; an unreadable input raises
    ``PGNError`` naming it.
    """
    for parsed in iter_parsed(source, require_clocks=require_clocks, stats=stats):
        yield parsed.game
