"""Per-position evaluation records: one Parquet row per position, committed chunk by chunk.

Layout of a records directory (the schema is documented in docs/records.md)::

    RECORDS/shard-00000-of-00002/manifest.json       what is committed, and the job's settings
    RECORDS/shard-00000-of-00002/chunk-000000.parquet one file per chunk of games
    RECORDS/shard-00000-of-00002/random.parquet       shard 0: random games (legality check)
    RECORDS/shard-00000-of-00002/calibration.json     shard 0: skill calibration table

A chunk is committed by writing its file under a temporary name, renaming it, then rewriting the
manifest (also write-then-rename) with the chunk listed. A restarted shard trusts only the
manifest, deletes files it does not list, and recomputes the rest; since a chunk's bytes depend
only on its games and the settings, the final files are byte-identical to an uninterrupted run.
Every path goes through ``etils.epath``, so records may live on GCS or S3.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from etils import epath

from allie_jax import vocab
from allie_jax.eval.positions import SPECIAL_MOVES
from allie_jax.eval.systems import Positions, Scores

FORMAT = 1
MANIFEST = "manifest.json"
RANDOM = "random.parquet"
CALIBRATION = "calibration.json"
SYSTEM_FIELDS = (
    "scored",
    "top_moves",
    "top_probs",
    "p_human",
    "think_time",
    "value",
    "top_legal",
    "invalid_mass",
    "num_sims",
    "resign",
)
_UCI = np.array([vocab.decode_move(i) for i in range(vocab.NUM_MOVES)], dtype=object)


class RecordsError(ValueError):
    """A records directory that cannot be used (missing shards, another job's records...)."""


# ------------------------------------------------------------------------------------------------
# Rows


def _nullable(values: np.ndarray, null: np.ndarray, type_: pa.DataType) -> pa.Array:
    return pa.array(values, type=type_, mask=np.asarray(null, bool))


def base_columns(pos: Positions) -> dict[str, pa.Array]:
    """The position's own facts, the same for every system (see docs/records.md)."""
    g, ply = pos.game, pos.ply
    games = [pos.games[int(i)] for i in g]
    gps = [pos.gps[int(i)] for i in g]
    num_moves = np.array([gp.num_moves for gp in gps], np.int32)
    moving = ply < num_moves
    safe = np.minimum(ply, np.maximum(num_moves - 1, 0))

    def per_move(field: str, dtype) -> np.ndarray:
        return np.array(
            [getattr(gp, field)[j] if m else 0 for gp, j, m in zip(gps, safe, moving, strict=True)],
            dtype,
        )

    human = pos.human_move()
    clock = per_move("clock_before", np.float64)
    think = per_move("think_time", np.float64)
    elo = lambda xs: pa.array(xs, type=pa.int32())  # noqa: E731 (None stays null)
    cols: dict[str, pa.Array] = {
        "game_id": pa.array([x.game_id for x in games], pa.string()),
        "ply": pa.array(ply, pa.int32()),
        "num_moves": pa.array(num_moves, pa.int32()),
        "white_elo": elo([x.white_elo for x in games]),
        "black_elo": elo([x.black_elo for x in games]),
        "white": pa.array([x.white or None for x in games], pa.string()),
        "black": pa.array([x.black or None for x in games], pa.string()),
        "time_control": pa.array([x.time_control for x in games], pa.string()),
        "clock_before": _nullable(clock, ~moving | np.isnan(clock), pa.float32()),
        "human_move": pa.array([_UCI[h] if h >= 0 else None for h in human], pa.string()),
        "human_think_time": _nullable(think, ~moving | (think < 0), pa.float32()),
        "in_check": pa.array([gp.in_check[j] for gp, j in zip(gps, ply, strict=True)], pa.bool_()),
        "num_legal": pa.array(
            [len(gp.legal_ids[j]) for gp, j in zip(gps, ply, strict=True)], pa.int32()
        ),
    }
    for k in SPECIAL_MOVES:
        flags = np.array(
            [gp.special[k][j] and m for gp, j, m in zip(gps, safe, moving, strict=True)], bool
        )
        cols[k] = pa.array(flags, pa.bool_())
    result = np.array([np.nan if x.result is None else x.result for x in games], np.float64)
    cols["result"] = _nullable(result, np.isnan(result), pa.float32())
    cols["termination"] = pa.array([x.termination for x in games], pa.string())
    cols["resigned"] = pa.array([gp.resigned for gp in gps], pa.bool_())
    cols["loser_to_move"] = pa.array([gp.loser_to_move for gp in gps], pa.bool_())
    return cols


def system_columns(name: str, scores: Scores) -> dict[str, pa.Array]:
    """``{name}.{field}`` columns; every field is null where the system did not score the row."""
    null = ~scores.scored
    counts = np.where(null, 0, (scores.top_moves >= 0).sum(axis=1)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    keep = np.arange(scores.top_moves.shape[1])[None, :] < counts[:, None]
    moves = pa.array(_UCI[scores.top_moves[keep]].tolist(), pa.string())
    probs = pa.array(scores.top_probs[keep].astype(np.float32), pa.float32())
    mask = pa.array(null)
    cols = {
        "scored": pa.array(scores.scored, pa.bool_()),
        "top_moves": pa.ListArray.from_arrays(pa.array(offsets), moves, mask=mask),
        "top_probs": pa.ListArray.from_arrays(pa.array(offsets), probs, mask=mask),
        "p_human": _nullable(scores.p_human, null | np.isnan(scores.p_human), pa.float32()),
        "think_time": _nullable(
            scores.think_time, null | np.isnan(scores.think_time), pa.float32()
        ),
        "value": _nullable(scores.value, null | np.isnan(scores.value), pa.float32()),
        "top_legal": _nullable(scores.top_legal, null, pa.bool_()),
        "invalid_mass": _nullable(
            scores.invalid_mass, null | np.isnan(scores.invalid_mass), pa.float32()
        ),
        "num_sims": _nullable(scores.num_sims, null, pa.int32()),
        "resign": _nullable(scores.resign, null, pa.bool_()),
    }
    return {f"{name}.{k}": v for k, v in cols.items()}


def chunk_table(pos: Positions, scores: Mapping[str, Scores]) -> pa.Table:
    cols = base_columns(pos)
    for name, sc in scores.items():
        if len(sc) != len(pos):
            raise ValueError(f"system {name!r} returned {len(sc)} rows for {len(pos)} positions")
        cols.update(system_columns(name, sc))
    return pa.table(cols)


def table_bytes(table: pa.Table) -> bytes:
    """Parquet bytes of a table (zstd; the same table always gives the same bytes)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=True)
    return buf.getvalue()


def read_table(path: epath.Path) -> pa.Table:
    return pq.read_table(io.BytesIO(epath.Path(path).read_bytes()))


# ------------------------------------------------------------------------------------------------
# One shard's directory: commit, resume


def shard_dirname(shard_index: int, num_shards: int) -> str:
    return f"shard-{shard_index:05d}-of-{num_shards:05d}"


def _atomic_write(path: epath.Path, data: bytes) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    tmp.replace(path)


LOCK_STALE_S = 3600.0  # a lock from another host untouched this long is taken over


class _LocalFile:
    """A lock file on a local (or network-mounted POSIX) path: ``O_EXCL`` creates it atomically."""

    def __init__(self, path: epath.Path):
        self.path = path

    def create(self, text: str) -> object | None:
        import os

        try:
            fd = os.open(str(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True

    def read(self) -> tuple[str, object] | None:
        try:
            return self.path.read_text(), True
        except FileNotFoundError:
            return None

    def delete(self, token: object) -> bool:
        self.path.unlink(missing_ok=True)
        return True

    def overwrite(self, text: str, token: object) -> object | None:
        self.path.write_text(text)
        return True


class _GcsObject:
    """A lock object on Cloud Storage, every change conditional on its generation: create only if
    absent (``if_generation_match=0``), and replace or delete only the generation that was read,
    so two tasks can neither both create it nor both take over the same stale one."""

    def __init__(self, path: epath.Path):
        from google.cloud import storage

        bucket, _, name = str(path).removeprefix("gs://").partition("/")
        self.bucket = storage.Client().bucket(bucket)
        self.name = name

    @staticmethod
    def _lost(e: Exception) -> bool:
        from google.api_core import exceptions

        return isinstance(e, exceptions.PreconditionFailed | exceptions.NotFound)

    def create(self, text: str) -> object | None:
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(text, if_generation_match=0)
        except Exception as e:
            if not self._lost(e):
                raise
            # a retried upload whose first attempt landed fails its precondition too: ours?
            got = self.read()
            return got[1] if got is not None and got[0] == text else None
        return blob.generation

    def read(self) -> tuple[str, object] | None:
        blob = self.bucket.get_blob(self.name)
        if blob is None:
            return None
        try:
            data = blob.download_as_bytes(if_generation_match=blob.generation)
        except Exception as e:
            if not self._lost(e):
                raise
            return None if self.bucket.get_blob(self.name) is None else self.read()
        return data.decode("utf-8", errors="replace"), blob.generation

    def delete(self, token: object) -> bool:
        try:
            self.bucket.blob(self.name).delete(if_generation_match=token)
        except Exception as e:
            if not self._lost(e):
                raise
            return False
        return True

    def overwrite(self, text: str, token: object) -> object | None:
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(text, if_generation_match=token)
        except Exception as e:
            if not self._lost(e):
                raise
            return None
        return blob.generation


class _BestEffortFile(_LocalFile):
    """A lock object on a store without a create-if-absent write (s3://, or gs:// without
    google-cloud-storage): write, then read back; two tasks racing within one round trip can
    both believe they hold it."""

    def create(self, text: str) -> object | None:
        if self.path.exists():
            return None
        self.path.write_text(text)
        return True if self.path.read_text() == text else None


def _lock_file(path: epath.Path):
    if "://" not in str(path):
        return _LocalFile(path)
    if str(path).startswith("gs://"):
        try:
            return _GcsObject(path)
        except Exception as e:  # no google-cloud-storage, or no credentials it can find
            import logging

            logging.getLogger(__name__).warning(
                "%s: google-cloud-storage unusable (%s); the lock is best effort", path, e
            )
    return _BestEffortFile(path)


class Lock:
    """An exclusive lock file. Creating it is atomic on a local path (``O_EXCL``) and on
    ``gs://`` (a create-if-absent upload; taking over and releasing are conditional on the
    generation read), best effort on other object stores (write, then read back). Its holder's
    host and pid are inside; a lock whose process is gone (same host) or untouched for
    ``LOCK_STALE_S`` (other host: the holder refreshes it with ``touch``) is stale and taken
    over."""

    def __init__(self, path: epath.Path, what: str):
        self.path = epath.Path(path)
        self.what = what
        self.held = False
        self._file = None
        self._token: object = None

    @property
    def file(self):
        if self._file is None:
            self._file = _lock_file(self.path)
        return self._file

    @staticmethod
    def _text() -> str:
        import os
        import socket
        import time
        import uuid

        info = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
        return json.dumps({**info, "nonce": uuid.uuid4().hex})  # each holder's text is its own

    @staticmethod
    def _stale(text: str) -> bool:
        import os
        import socket
        import time

        try:
            info = json.loads(text)
        except ValueError:
            return True  # unreadable (a crash mid-write): not a live holder
        if info.get("host") == socket.gethostname():
            try:
                os.kill(int(info["pid"]), 0)
            except ProcessLookupError:
                return True
            except (PermissionError, KeyError, ValueError, TypeError):
                return False
            return False
        return time.time() - float(info.get("time", 0)) > LOCK_STALE_S

    def acquire(self, *, wait: bool = False) -> bool:
        """Take the lock; False when someone else holds it (``wait``: poll until free)."""
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        pause = 1.0  # waiting tasks back off to one attempt per 15 s (an object store's write
        # rate on one object is limited, and a hundred tasks may wait for one index)
        while True:
            token = self.file.create(self._text())
            if token is not None:
                self.held, self._token = True, token
                return True
            got = self.file.read()
            if got is None:
                continue  # released between our create and our read: try again
            text, seen = got
            if self._stale(text):
                self.file.delete(seen)  # only the generation judged stale (gs://)
                continue
            if not wait:
                return False
            time.sleep(pause)
            pause = min(pause * 1.5, 15.0)

    def holder(self) -> str:
        try:
            got = self.file.read()
            info = json.loads(got[0]) if got else {}
            return f"{info['host']} pid {info['pid']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def touch(self) -> None:
        """Refresh the holder's time (a long holder on another host is not taken for dead)."""
        if self.held:
            token = self.file.overwrite(self._text(), self._token)
            if token is None:
                import logging

                logging.getLogger(__name__).warning(
                    "%s: the %s lock was taken over by %s", self.path, self.what, self.holder()
                )
                self.held = False
                return
            self._token = token

    def release(self) -> None:
        if self.held:
            self.file.delete(self._token)
            self.held = False


@dataclasses.dataclass
class ShardStore:
    """A shard's records directory and its manifest (the only source of truth on restart)."""

    root: epath.Path
    shard_index: int
    num_shards: int
    job: dict  # settings that must match for a restart to reuse committed chunks

    def __post_init__(self) -> None:
        self.root = epath.Path(self.root)
        self.dir = self.root / shard_dirname(self.shard_index, self.num_shards)
        self.manifest: dict[str, Any] = {
            "format": FORMAT,
            "shard_index": self.shard_index,
            "num_shards": self.num_shards,
            "job": self.job,
            "chunks": [],
            "extras": {},
            "complete": False,
        }

    def open(self) -> int:
        """Lock, then create or resume the shard; returns how many chunks are already committed.
        A shard another live process holds is refused (two writers would corrupt it)."""
        self.lock = Lock(self.root / f"{self.dir.name}.lock", f"shard {self.shard_index}")
        if not self.lock.acquire():
            raise RecordsError(
                f"{self.dir} is being written by {self.lock.holder()} (lock {self.lock.path}); "
                "if that process is gone, delete the lock"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / MANIFEST
        if path.exists():
            old = json.loads(path.read_text())
            new = jsonable(self.job)
            if old.get("job") != new:
                diff = _differences(old.get("job", {}), new)
                raise RecordsError(
                    f"{self.dir} holds records of another job (settings differ: {diff}); "
                    "use a new --records directory or delete it"
                )
            self.manifest = old
            self.manifest["complete"] = False
        listed = {c["file"] for c in self.manifest["chunks"]} | set(
            self.manifest["extras"].values()
        )
        # uncommitted leftovers of a killed run (an object store has no empty folders: on gs://
        # the folder made above does not exist until its first file does)
        for f in self.dir.iterdir() if self.dir.exists() else ():
            if f.name != MANIFEST and f.name not in listed:
                f.unlink()
        return len(self.manifest["chunks"])

    @property
    def committed(self) -> int:
        return len(self.manifest["chunks"])

    def commit_chunk(self, index: int, table: pa.Table, info: Mapping[str, Any]) -> None:
        if index != self.committed:
            raise RecordsError(f"chunk {index} committed out of order (next is {self.committed})")
        name = f"chunk-{index:06d}.parquet"
        data = table_bytes(table)
        _atomic_write(self.dir / name, data)
        entry = {"file": name, "rows": table.num_rows, "sha256": hashlib.sha256(data).hexdigest()}
        self.manifest["chunks"].append({**entry, **info})
        self._save()
        self.lock.touch()

    def check_chunk(self, index: int, span: Mapping[str, str]) -> None:
        """A committed chunk being skipped must hold the same games as the input's chunk now."""
        entry = self.manifest["chunks"][index]
        got = {k: entry.get(k) for k in span}
        if got != dict(span):
            raise RecordsError(
                f"{self.dir}: chunk {index} was committed for games {got} but the input now has "
                f"{dict(span)} there; the games file changed: use a new --records directory"
            )

    def commit_extra(self, key: str, name: str, data: bytes) -> None:
        _atomic_write(self.dir / name, data)
        self.manifest["extras"][key] = name
        self._save()

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.manifest.update(summary)
        self.manifest["complete"] = True
        self._save()
        self.close()

    def close(self) -> None:
        """Release the shard's lock (also on an error, so a rerun may take the shard)."""
        lock = getattr(self, "lock", None)
        if lock is not None:
            lock.release()

    def _save(self) -> None:
        text = json.dumps(jsonable(self.manifest), indent=1, sort_keys=True, allow_nan=False)
        _atomic_write(self.dir / MANIFEST, text.encode())


def _differences(a: Mapping, b: Mapping, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out += _differences(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}")
    return out


# ------------------------------------------------------------------------------------------------
# Reading a records directory back


@dataclasses.dataclass
class Records:
    """Every shard's rows (sorted by game id and ply: the order does not depend on the sharding)."""

    human: pa.Table
    random: pa.Table | None
    manifests: list[dict]
    calibration: dict | None
    root: str


def find_records(path: str | epath.Path) -> epath.Path:
    """``path`` itself or its ``records/`` subdirectory, whichever holds shard directories."""
    path = epath.Path(path)
    for cand in (path, path / "records"):
        if cand.is_dir() and any(cand.glob("shard-*-of-*/" + MANIFEST)):
            return cand
    raise RecordsError(f"no evaluation records under {path} (expected shard-*-of-*/{MANIFEST})")


def load_manifests(root: epath.Path) -> list[dict]:
    manifests = [json.loads(p.read_text()) for p in sorted(root.glob(f"shard-*-of-*/{MANIFEST}"))]
    counts = {m["num_shards"] for m in manifests}
    if len(counts) != 1:
        raise RecordsError(f"{root} mixes jobs with different shard counts {sorted(counts)}")
    return manifests


def shards_complete(root: epath.Path) -> bool:
    try:
        manifests = load_manifests(root)
    except (RecordsError, FileNotFoundError):
        return False
    n = manifests[0]["num_shards"]
    done = {m["shard_index"] for m in manifests if m.get("complete")}
    return done == set(range(n))


def _lean(table: pa.Table) -> pa.Table:
    """The columns the report reads, with each system's top-k list cut to its top move
    (``S.top1``): a fraction of the memory, which matters when a job holds millions of rows."""
    drop = [c for c in table.column_names if c.endswith((".top_probs", ".p_human"))]
    table = table.drop_columns(drop)
    for c in [c for c in table.column_names if c.endswith(".top_moves")]:
        system = c[: -len(".top_moves")]
        i = table.column_names.index(c)
        table = table.set_column(i, f"{system}.top1", top1_array(table, system))
    return table


def load_records(
    path: str | epath.Path, *, filter: str | None = None, lean: bool = False
) -> Records:
    """Merge every shard's records; ``filter`` (``parse_filter``) keeps matching human rows;
    ``lean`` keeps only what the report reads (``_lean``), chunk by chunk."""
    expr = parse_filter(filter) if filter else None
    root = find_records(path)
    manifests = load_manifests(root)
    n = manifests[0]["num_shards"]
    have = {m["shard_index"]: m for m in manifests}
    missing = [k for k in range(n) if k not in have or not have[k].get("complete")]
    if missing:
        raise RecordsError(
            f"{root}: shards {missing} of {n} are missing or unfinished; run them (same flags, "
            "--shard_index K) before building the report"
        )
    for m in manifests[1:]:
        diff = _differences(manifests[0]["job"], m["job"])
        if diff:
            raise RecordsError(
                f"{root}: shard {m['shard_index']} was run with other settings than shard "
                f"{manifests[0]['shard_index']}: {', '.join(diff)} differ"
            )
    tables, random, calibration = [], None, None
    for k in range(n):
        d = root / shard_dirname(k, n)
        for c in have[k]["chunks"]:
            table = read_table(d / c["file"])
            if expr is not None:  # filter before the merge: only the kept rows are held
                table = table.filter(expr)
            tables.append(_lean(table) if lean else table)
        extras = have[k].get("extras", {})
        if "random" in extras:
            random = read_table(d / extras["random"])
            random = _lean(random) if lean else random
        if "calibration" in extras:
            calibration = json.loads((d / extras["calibration"]).read_text())
    if tables:
        human = pa.concat_tables(tables)
    else:
        raise RecordsError(f"{root}: the shards hold no records")
    human = human.sort_by([("game_id", "ascending"), ("ply", "ascending")])
    return Records(human, random, manifests, calibration, str(root))


class Job:
    """Every shard of one evaluation job, read lazily: from one records directory, or from a
    parent folder holding per-task records directories (a job array whose tasks each wrote under
    their own ``--output``). Shards must be complete, and their settings equal; a mismatch names
    the differing keys."""

    def __init__(self, shards: list[tuple[epath.Path, dict]], root: str):
        self.shards = shards  # (shard dir, manifest), in shard order
        self.manifests = [m for _, m in shards]
        self.root = root

    def _read(self, path: epath.Path, columns: list[str] | None) -> pa.Table:
        buf = io.BytesIO(epath.Path(path).read_bytes())
        if columns is None:
            return pq.read_table(buf)
        names = set(pq.read_schema(buf).names)
        buf.seek(0)
        return pq.read_table(buf, columns=[c for c in columns if c in names])

    def human_chunks(self, *, filter: str | None = None, columns: list[str] | None = None):
        """Each committed chunk's table (``filter`` applied), one at a time."""
        expr = parse_filter(filter) if filter else None
        for d, m in self.shards:
            for c in m["chunks"]:
                table = self._read(d / c["file"], columns)
                yield table.filter(expr) if expr is not None else table

    def random_table(self) -> pa.Table | None:
        for d, m in self.shards:
            if "random" in m.get("extras", {}):
                return read_table(d / m["extras"]["random"])
        return None

    def calibration(self) -> dict | None:
        for d, m in self.shards:
            if "calibration" in m.get("extras", {}):
                return json.loads((d / m["extras"]["calibration"]).read_text())
        return None


def _shard_dirs(path: epath.Path) -> list[epath.Path]:
    return sorted(p.parent for p in path.glob(f"shard-*-of-*/{MANIFEST}"))


def open_job(path: str | epath.Path) -> Job:
    """The job whose records lie under ``path``: a records directory, an output directory with
    ``records/``, or a parent of per-task output or records directories (merged)."""
    path = epath.Path(path)
    dirs: list[epath.Path] = []
    for cand in (path, path / "records"):
        if cand.is_dir() and (dirs := _shard_dirs(cand)):
            break
    if not dirs and path.is_dir():
        for sub in sorted(p for p in path.iterdir() if p.is_dir()):
            for cand in (sub, sub / "records"):
                dirs += _shard_dirs(cand) if cand.is_dir() else []
    if not dirs:
        raise RecordsError(
            f"no evaluation records under {path} (expected shard-*-of-*/{MANIFEST} there, in "
            "records/, or in per-task folders below it)"
        )
    found = [(d, json.loads((d / MANIFEST).read_text())) for d in dirs]
    counts = {m["num_shards"] for _, m in found}
    if len(counts) != 1:
        raise RecordsError(f"{path} mixes jobs with different shard counts {sorted(counts)}")
    n = counts.pop()
    by_index: dict[int, tuple[epath.Path, dict]] = {}
    for d, m in found:
        k = m["shard_index"]
        if k in by_index and by_index[k][1].get("complete") and m.get("complete"):
            raise RecordsError(
                f"shard {k} of {n} is complete in two places ({by_index[k][0]} and {d}); keep one"
            )
        if k not in by_index or m.get("complete"):
            by_index[k] = (d, m)
    missing = [k for k in range(n) if k not in by_index or not by_index[k][1].get("complete")]
    if missing:
        raise RecordsError(
            f"{path}: shards {missing} of {n} are missing or unfinished; run them (same flags, "
            "--shard_index K) before building the report"
        )
    shards = [by_index[k] for k in range(n)]
    first = shards[0][1]["job"]
    for d, m in shards[1:]:
        diff = _differences(first, m["job"])
        if diff:
            raise RecordsError(
                f"{d} was run with other settings than {shards[0][0]}: {', '.join(diff)} differ"
            )
    if not any(m["chunks"] for _, m in shards):
        raise RecordsError(f"{path}: the shards hold no records")
    return Job(shards, str(path))


# ------------------------------------------------------------------------------------------------
# --filter "white_elo >= 2000 and time_control == '180+0'"

_CMP = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}


def parse_filter(text: str) -> pc.Expression:
    """A row filter over record columns, in Python syntax: comparisons (chains allowed), ``and``,
    ``or``, ``not``, ``in [...]``, ``is None`` / ``is not None``, arithmetic, and column names
    (``policy.p_human`` names a system column). Anything else is rejected with the reason."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"--filter {text!r} is not an expression: {e.msg}") from e
    return _expr(tree.body, text)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _expr(node: ast.AST, text: str) -> Any:
    bad = lambda why: ValueError(f"--filter {text!r}: {why}")  # noqa: E731
    if (name := _name(node)) is not None:
        return pc.field(name)
    if isinstance(node, ast.Constant):
        return pc.scalar(node.value)
    if isinstance(node, ast.BoolOp):
        parts = [_expr(v, text) for v in node.values]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(node.op, ast.And) else (out | p)
        return out
    if isinstance(node, ast.UnaryOp):
        inner = _expr(node.operand, text)
        if isinstance(node.op, ast.Not):
            return ~inner
        if isinstance(node.op, ast.USub):
            return pc.negate(inner)
        raise bad(f"unsupported operator {type(node.op).__name__}")
    if isinstance(node, ast.BinOp):
        ops = {ast.Add: pc.add, ast.Sub: pc.subtract, ast.Mult: pc.multiply, ast.Div: pc.divide}
        op = ops.get(type(node.op))
        if op is None:
            raise bad(f"unsupported operator {type(node.op).__name__}")
        return op(_expr(node.left, text), _expr(node.right, text))
    if isinstance(node, ast.Compare):
        out, left = None, node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, ast.In | ast.NotIn):
                if not isinstance(right, ast.List | ast.Tuple | ast.Set):
                    raise bad("'in' needs a literal list")
                values = [ast.literal_eval(e) for e in right.elts]
                term = _expr(left, text).isin(values)
                term = ~term if isinstance(op, ast.NotIn) else term
            elif isinstance(op, ast.Is | ast.IsNot):
                if not (isinstance(right, ast.Constant) and right.value is None):
                    raise bad("'is' compares with None only")
                term = _expr(left, text).is_null()
                term = ~term if isinstance(op, ast.IsNot) else term
            else:
                term = _CMP[type(op)](_expr(left, text), _expr(right, text))
            out = term if out is None else out & term
            left = right
        return out
    raise bad(f"unsupported syntax {type(node).__name__}")


def jsonable(x, *, nan_as_none: bool = False):
    """``x`` with numpy scalars, tuples and non-string keys made JSON types. ``nan_as_none``:
    non-finite floats become null (strict JSON has no NaN; a report's "not measurable")."""
    if isinstance(x, dict):
        return {str(k): jsonable(v, nan_as_none=nan_as_none) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v, nan_as_none=nan_as_none) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if nan_as_none and isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def column(table: pa.Table, name: str, dtype=np.float64, fill=np.nan) -> np.ndarray:
    """A column as numpy with nulls replaced by ``fill`` (missing column: all ``fill``)."""
    if name not in table.column_names:
        return np.full(table.num_rows, fill, dtype)
    col = table.column(name)
    if np.dtype(dtype).kind == "f":
        col = col.cast(pa.float64())
    if col.null_count:
        col = pc.fill_null(col, pa.scalar(fill, col.type))
    return col.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def top1_array(table: pa.Table, system: str) -> pa.Array:
    """Each row's top move of ``system`` (UCI; null where not scored or no legal move)."""
    if f"{system}.top1" in table.column_names:
        return table.column(f"{system}.top1").combine_chunks()
    arr = table.column(f"{system}.top_moves").combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    starts = np.cumsum(lengths) - lengths
    flat = arr.flatten()
    if not len(flat):
        return pa.nulls(len(arr), pa.string())
    has = lengths > 0
    first = pc.take(flat, pa.array(np.where(has, starts, 0).astype(np.int64)))
    return pc.if_else(pa.array(has), first, pa.scalar(None, pa.string()))
