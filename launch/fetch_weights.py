"""Fetch released weights: ``python -m launch.fetch_weights allie|maia [--output DIR]``.

    python -m launch.fetch_weights allie --output ckpt/allie    # Hub -> checked -> model dir
    python -m launch.fetch_weights allie --sha256 e64e8862...   # refuse any other file
    python -m launch.fetch_weights maia --output maia1           # the nine Maia-1 nets

``allie`` downloads the released ``best.pt`` from the Hugging Face Hub (``HF_ENDPOINT``,
``HF_HOME`` and ``HF_TOKEN`` apply), checks its size and sha256 against the Hub's metadata, converts
it once through torch's restricted loader and prints the model directory to pass as
``--checkpoint``. ``maia`` writes ``maia-1100.pb.gz`` … ``maia-1900.pb.gz``, each checked against
its pinned digest (use it as ``maia:DIR``). An interrupted download resumes when rerun; a failure
is one line naming the URL, exit status 1.
"""

from __future__ import annotations

import sys

from absl import app, flags

from allie_jax import cli, weights

_OUTPUT = flags.DEFINE_string(
    "output", None, "Model directory (allie; default: a cache folder) or folder of the nets (maia)."
)
_SHA256 = flags.DEFINE_string("sha256", None, "allie: the digest the file must have (pinned).")
_REPO = flags.DEFINE_string("repo", weights.ALLIE_REPO, "allie: Hub dataset repository.")
_FILE = flags.DEFINE_string("file", weights.ALLIE_FILE, "allie: file in the repository.")
_REVISION = flags.DEFINE_string("revision", weights.ALLIE_REVISION, "allie: branch or commit.")
_SIZE = flags.DEFINE_string("size", None, "allie: named model size (inferred when not given).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "allie: Hub cache (default: HF_HOME's).")
_BASE_URL = flags.DEFINE_string(
    "base_url", None, "maia: where the .pb.gz files are (default: the pinned repository commit)."
)
_RATINGS = flags.DEFINE_list("ratings", None, "maia: ratings to fetch (default: all nine).")

WHAT = ("allie", "maia")


def main(argv: list[str]) -> None:
    cli.setup("launch.fetch_weights")
    what = argv[1:]
    if len(what) != 1 or what[0] not in WHAT:
        cli.fail("launch.fetch_weights", f"say what to fetch: one of {', '.join(WHAT)}", code=2)
    try:
        if what[0] == "allie":
            out = weights.fetch_released_allie(
                _OUTPUT.value,
                repo_id=_REPO.value,
                filename=_FILE.value,
                revision=_REVISION.value,
                sha256=_SHA256.value,
                cache_dir=_CACHE_DIR.value,
                size=_SIZE.value,
                log=_say,
            )
            print(f"released Allie: {out}  (use --checkpoint {out})")
        else:
            ratings = [int(r) for r in _RATINGS.value] if _RATINGS.value else None
            out = _OUTPUT.value or str(weights.cache_root() / "maia1")
            done = weights.fetch_maia(
                out,
                base_url=_BASE_URL.value,
                log=_say,
                **({"ratings": ratings} if ratings else {}),
            )
            print(f"Maia-1: {len(done['files'])} nets in {out}  (use --checkpoint maia:{out})")
    except (weights.FetchError, OSError, ValueError) as err:
        cli.fail("launch.fetch_weights", str(err))


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    app.run(main)
