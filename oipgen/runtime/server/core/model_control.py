"""Model control, by Triton's three modes (`Settings.model_control_mode`, `--model-control-mode`): which models
load at start (`load_at_start`), whether load and unload requests are served (`refuse_requests`), and whether the
repository is polled for changes (`polls`; `poll` runs `ModelRepository.sync` every
`Settings.repository_poll_secs`, in the process that serves, `process.serve`, and in each Ray replica).

- `explicit` (the default, with `load_model` "*"): the models named in `load_model` load at start ("*": every
  one), and the others on request; load and unload requests are served.
- `none`: every model loads at start; load and unload requests are refused (UNAVAILABLE) and the repository is
  not read again.
- `poll`: every model loads at start; load and unload requests are refused; the repository is read again every
  `repository_poll_secs` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Final

from ..errors import NotReady
from ..settings import Settings
from .repository import ModelRepository

__all__ = ["ALL", "MODES", "check", "load_at_start", "poll", "polls", "refuse_requests"]

MODES: Final = ("none", "explicit", "poll")
ALL: Final = "*"
"""`load_model` naming every model of the repository."""

log = logging.getLogger(__name__)


def check(settings: Settings) -> None:
    """ValueError, saying what is wrong, for model control settings that do not go together."""
    mode, names = settings.model_control_mode, settings.load_model
    if mode not in MODES:
        raise ValueError(f"--model-control-mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "explicit" and names and tuple(names) != (ALL,):
        raise ValueError(f"--load-model is for --model-control-mode explicit; with {mode}, every model loads")
    if ALL in names and len(names) > 1:
        raise ValueError("--load-model '*' loads every model: give it alone, not with other --load-model names")
    if any(not name or "/" in name for name in names):
        raise ValueError(f"--load-model takes model names (non-empty, no '/'), got {list(names)!r}")
    seconds = settings.repository_poll_secs
    if mode == "poll" and not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"--repository-poll-secs must be a positive number of seconds in poll mode, got {seconds}")


def polls(settings: Settings) -> bool:
    """Whether the repository is read again every `repository_poll_secs` seconds."""
    return settings.model_control_mode == "poll"


def refuse_requests(settings: Settings) -> None:
    """NotReady (REST 503, gRPC UNAVAILABLE, as Triton answers) unless load and unload requests are served."""
    mode = settings.model_control_mode
    if mode != "explicit":
        why = ("the repository is polled for changes" if mode == "poll"
               else "models are loaded at start only")
        raise NotReady(f"load and unload requests are refused: the server runs with --model-control-mode {mode} "
                       f"({why}); --model-control-mode explicit serves them")


async def load_at_start(repository: ModelRepository, settings: Settings) -> list[str]:
    """Load the models the mode loads at start; the failures, one line per model that did not load (each is in
    the index and the log too)."""
    names = tuple(settings.load_model)
    if settings.model_control_mode != "explicit" or names == (ALL,):
        await repository.load_all()
        wanted = repository.names()
    else:
        await repository.scan()
        known = set(repository.names())
        wanted = [name for name in dict.fromkeys(names) if name in known]
        await repository.load_quietly(wanted)
    failures = [f"--load-model {name}: no such model in the model repository" for name in names
                if name != ALL and name not in repository.names()]
    for failure in failures:
        log.error("%s", failure)
    return failures + [reason for reason in map(repository.failure, wanted) if reason]


async def poll(sync: Callable[[], Awaitable[list[str]]], seconds: float) -> None:
    """Poll mode, until cancelled: every `seconds`, make the models those of the repository as it is then
    (`sync`), and log what changed. A failing poll is logged and the next one comes all the same."""
    while True:
        await asyncio.sleep(seconds)
        try:
            for change in await sync():
                log.info("repository poll: %s", change)
        except Exception:
            log.exception("polling the model repository failed")
