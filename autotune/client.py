"""The one place an ``httpx.AsyncClient`` for a server is built.

``trust_env=False``: a proxy configured in the environment must never sit between autotune and
a server on 127.0.0.1. The per-trial API key travels in the Authorization header.
"""

from __future__ import annotations

import httpx

from autotune.engines.base import LaunchConfig


def build_client(launch: LaunchConfig, *, max_connections: int = 64,
                 timeout_s: float = 60.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=launch.base_url,
        headers={"Authorization": f"Bearer {launch.api_key}"},
        timeout=httpx.Timeout(timeout_s, connect=5.0),
        limits=httpx.Limits(max_connections=max_connections,
                            max_keepalive_connections=max_connections),
        trust_env=False,
    )
