"""Model configs read from the Hugging Face Hub for job and deployment creation.

A request that names a Hub model reads its config.json here, before its unit of work, with no
database connection held: asynchronously (no threadpool thread waits either), with one overall
timeout (``SPECDECK_HUB_TIMEOUT_SECONDS``) and no retries. A slow or unreachable Hub costs that
request at most the timeout, and every other request nothing. Configs are cached in the process
for ``SPECDECK_HUB_CACHE_SECONDS``; when the Hub cannot be reached, a copy in the local Hugging
Face cache (a host that already downloaded the model) is used instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache
from huggingface_hub.utils import build_hf_headers

from app.errors import APIError
from app.schemas.jobs import HF_REPO_ID
from app.services.paths import exists, looks_like_path
from app.settings import Settings

CONFIG = "config.json"
# (endpoint, repo id) -> (expires at, config.json's bytes)
_cache: dict[tuple[str, str], tuple[float, bytes]] = {}


def is_hub_reference(reference: str, settings: Settings) -> bool:
    """A Hub id ("org/name") that is not a directory under the models root."""
    return (not looks_like_path(reference) and not exists(settings.models_root / reference)
            and HF_REPO_ID.fullmatch(reference) is not None)


async def fetch_configs(references: Mapping[str, str | None],
                        settings: Settings) -> dict[str, bytes]:
    """config.json of each Hub model among ``references`` ({param: reference}), by reference.
    Local paths are skipped: they are read inside the unit of work."""
    wanted = {ref: param for param, ref in references.items()
              if ref is not None and is_hub_reference(ref, settings)}
    contents = await asyncio.gather(*(_config(ref, param, settings) for ref, param in wanted.items()))
    return dict(zip(wanted, contents))


async def _config(repo_id: str, param: str, settings: Settings) -> bytes:
    url = hf_hub_url(repo_id, CONFIG, endpoint=settings.hf_endpoint)
    key = (url, repo_id)
    cached = _cache.get(key)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    if constants.HF_HUB_OFFLINE:
        return _from_local_cache(repo_id, param, "HF_HUB_OFFLINE is set")
    timeout = settings.hub_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=True,
                                         headers=build_hf_headers()) as client:
                response = await client.get(url)
    except (httpx.HTTPError, TimeoutError):
        return _from_local_cache(repo_id, param, f"the Hugging Face Hub did not answer within "
                                 f"{timeout:g} s (SPECDECK_HUB_TIMEOUT_SECONDS)")
    if response.status_code in (401, 403, 404):
        raise APIError(422, f"{param} '{repo_id}' has no config.json on the Hugging Face Hub "
                       f"(HTTP {response.status_code}: no such repo, or it is private or gated)",
                       code=f"{param}_not_found", param=param)
    if response.status_code != 200:
        return _from_local_cache(repo_id, param, f"the Hugging Face Hub answered HTTP "
                                 f"{response.status_code}")
    _cache[key] = (time.monotonic() + settings.hub_cache_seconds, response.content)
    return response.content


def _from_local_cache(repo_id: str, param: str, why: str) -> bytes:
    local = try_to_load_from_cache(repo_id, CONFIG)
    if isinstance(local, str):
        return Path(local).read_bytes()
    raise APIError(503, f"could not read config.json of {param} '{repo_id}': {why}, and it is "
                   "not in the local Hugging Face cache; retry, or use a model directory under "
                   "the models root", code="hub_unavailable", param=param,
                   headers={"Retry-After": "10"})
