"""One `docker pull` of the client image, read as the operator needs it: how far it is
(one percentage over every layer, download and unpacking), which digest the registry
served, and, when it fails, why in words (the registry does not answer, it has no such
tag) naming the registry and the tag.

Pure: it reads the engine's pull stream (dicts) and error texts; run_manager.engine
does the pulling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

DOCKER_HUB = "docker.io"
_DIGEST_STATUS = re.compile(r"^Digest: (sha256:[0-9a-f]{64})$")
# The engine's words for a registry that is not there (refused, no route, no such
# host, timed out) and for a tag the registry does not have.
_UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|network is unreachable|no route to host"
    r"|connection reset|server misbehaving|Client\.Timeout",
    re.IGNORECASE,
)
_NO_SUCH_TAG = re.compile(r"manifest unknown|not found: manifest|manifest for \S+ not found",
                          re.IGNORECASE)
# The statuses after which a layer's bytes are all downloaded / all unpacked.
_DOWNLOADED = {"Download complete", "Verifying Checksum", "Extracting", "Pull complete"}
_UNPACKED = {"Pull complete", "Already exists"}


@dataclass(frozen=True)
class PullProgress:
    """Progress of one `docker pull`, summed over the layers seen so far: each layer's
    bytes count twice, once downloaded and once unpacked, so 100% is a usable image."""

    image: str
    status: str
    current_bytes: int
    total_bytes: int

    @property
    def fraction(self) -> float | None:
        """0.0 .. 1.0, or None while no layer size is known yet."""
        return None if self.total_bytes <= 0 else min(1.0, self.current_bytes / self.total_bytes)


@dataclass
class PullTracker:
    """Folds the engine's pull events into PullProgress and the manifest digest."""

    image: str
    digest: str | None = None
    _layer_bytes: dict[str, int] = field(default_factory=dict)
    _downloaded: dict[str, int] = field(default_factory=dict)
    _unpacked: dict[str, int] = field(default_factory=dict)

    def feed(self, event: dict[str, Any]) -> PullProgress:
        status = str(event.get("status", ""))
        if (found := _DIGEST_STATUS.match(status)) is not None:
            self.digest = found.group(1)
        layer = event.get("id")
        detail = event.get("progressDetail") or {}
        if isinstance(layer, str) and detail.get("total"):
            self._layer_bytes[layer] = int(detail["total"])
        if isinstance(layer, str) and layer in self._layer_bytes:  # a layer being fetched
            size = self._layer_bytes[layer]
            current = int(detail.get("current", 0))
            if status == "Downloading":
                self._downloaded[layer] = current
            elif status in _DOWNLOADED:
                self._downloaded[layer] = size
            if status == "Extracting":
                self._unpacked[layer] = current
            elif status in _UNPACKED:
                self._unpacked[layer] = size
        done = sum(self._downloaded.values()) + sum(self._unpacked.values())
        return PullProgress(self.image, status, done, 2 * sum(self._layer_bytes.values()))


def registry_of(repository: str) -> str:
    """The registry host of an image repository, as Docker reads it: the first path part
    when it has a '.' or a ':' or is localhost; Docker Hub otherwise."""
    first, slash, _ = repository.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def why_unpullable(repository: str, tag: str, reason: str) -> str:
    """One line saying why `repository:tag` cannot be pulled, naming the registry (and
    the tag when the registry lacks it), with what the operator can do."""
    reason = " ".join(reason.split())  # the engine's text may hold newlines
    registry = registry_of(repository)
    name = repository.removeprefix(registry + "/") if registry != DOCKER_HUB else repository
    if _NO_SUCH_TAG.search(reason):
        return (f"the registry {registry} has no tag {tag} of {name} ({reason}); publish that "
                "version there (scripts/publish_client_image.sh) or check CLIENT_IMAGE")
    if _UNREACHABLE.search(reason):
        return (f"the registry {registry} does not answer ({reason}); start it or check "
                "CLIENT_IMAGE and your network")
    return f"the registry {registry} refused the pull ({reason}); check CLIENT_IMAGE and your login"
