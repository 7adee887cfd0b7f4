"""Play Allie in a browser: ``python -m launch.play --checkpoint DIR`` (see ``server``)."""

from allie_jax.engine.web.server import (
    PlayApp,
    allie_app,
    allie_player,
    load_app,
    make_server,
    serve,
)
from allie_jax.engine.web.session import GameSession, GameSettings, RequestError

__all__ = [
    "GameSession",
    "GameSettings",
    "PlayApp",
    "RequestError",
    "allie_app",
    "allie_player",
    "load_app",
    "make_server",
    "serve",
]
