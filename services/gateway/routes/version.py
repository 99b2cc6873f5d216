"""GET /version (vLLM's): the server's version, the installed baton package's."""
from __future__ import annotations

from importlib.metadata import version

from fastapi import APIRouter
from pydantic import BaseModel


class VersionResponse(BaseModel):
    version: str


def routes() -> APIRouter:
    router = APIRouter()
    answer = {"version": version("baton")}

    @router.get("/version", response_model=VersionResponse)
    async def version_route() -> dict[str, str]:
        return answer

    return router
