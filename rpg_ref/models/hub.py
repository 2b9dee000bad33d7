"""Is a model's source reachable? Asked before anything slow starts: a missing folder, or an
unreachable hub, is one clear line in seconds, not a minute of download retries."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from urllib.parse import urlparse

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def check_model_source(spec: str, flag: str) -> None:
    """``spec`` is a local file or folder, a hub id in the local Hugging Face cache, or a hub id
    with the hub reachable. An unreachable hub is found in seconds (one connection attempt), not
    after a minute of download retries; HF_HUB_OFFLINE=1 skips the attempt."""
    if Path(spec).exists():
        return
    if not HUB_ID.fullmatch(spec):
        raise ValueError(
            f"{flag} {spec!r}: no such file or folder (nor a Hugging Face id 'org/name')"
        )
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return  # cached: works offline
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    port = urlparse(constants.ENDPOINT).port or (
        80 if constants.ENDPOINT.startswith("http:") else 443
    )
    fix = ("download it where there is a network and pass its folder, or pass a config.json for a "
           "randomly initialized model")
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"{flag} {spec!r} is not a local folder and not in the Hugging Face cache, "
            f"and HF_HUB_OFFLINE is set: {fix}"
        )
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise ValueError(
            f"{flag} {spec!r} is not a local folder and not in the Hugging Face cache, "
            f"and the hub ({host}:{port}) cannot be reached ({e}): {fix}"
        ) from e
