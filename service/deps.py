"""Typed dependencies of the routes. Everything here is built once, in the app's
lifespan (``service.lifecycle``), and read from ``app.state``.

The getters are ``async`` on purpose: FastAPI runs a plain-def dependency in the
thread pool, one thread hand-off (two wake-ups) per request just to read an
attribute.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .batcher import ScoreBatcher
from .engine import Engine
from .lifecycle import BackgroundTasks
from .model_follower import ModelFollower
from .settings import Settings


async def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def batcher_of(request: Request) -> ScoreBatcher:
    batcher: ScoreBatcher = request.app.state.batcher
    return batcher


async def background_of(request: Request) -> BackgroundTasks:
    background: BackgroundTasks = request.app.state.background
    return background


async def follower_of(request: Request) -> ModelFollower:
    follower: ModelFollower = request.app.state.follower
    return follower


SettingsDep = Annotated[Settings, Depends(settings_of)]
EngineDep = Annotated[Engine, Depends(engine_of)]
BatcherDep = Annotated[ScoreBatcher, Depends(batcher_of)]
BackgroundDep = Annotated[BackgroundTasks, Depends(background_of)]
FollowerDep = Annotated[ModelFollower, Depends(follower_of)]
