"""The shape of a Hugging Face Hub id (``org/name``), checked without importing huggingface_hub: the
config validates ``model.path`` with it; ``platform/hub.py`` resolves ids to local snapshots."""

from __future__ import annotations

import re

_ID_PART = re.compile(r"^[A-Za-z0-9][\w.-]*$")
_ID_MAX = 96


def looks_like_hub_id(text: str) -> bool:
    """``org/name`` shaped (one slash, not a path starting with /, ., ~): meant as an id, valid or not."""
    return text.count("/") == 1 and not text.startswith(("/", ".", "~")) and all(text.split("/"))


def hub_id_problem(text: str) -> str | None:
    """Why ``text`` (``org/name`` shaped) is not a valid Hub id, or None if it is one."""
    if "@" in text:
        return "'@' is not allowed in an id (give the revision in its own setting)"
    if len(text) > _ID_MAX:
        return f"longer than {_ID_MAX} characters"
    for part in text.split("/"):
        if not _ID_PART.match(part):
            return (
                f"{part!r} may hold only letters, digits, '-', '_' and '.', and start with a letter or digit"
            )
        if "--" in part or ".." in part or part.endswith((".", "-", ".git")):
            return f"{part!r} has '--' or '..' or ends with '.', '-' or '.git'"
    return None


def is_hub_id(text: str) -> bool:
    return looks_like_hub_id(text) and hub_id_problem(text) is None
