"""Reading the YAML files users give us (price catalog, team map, site config), one way."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_yaml(path: str | Path, what: str, error: type[Exception] = ValueError) -> Any:
    """The parsed YAML (or JSON) of ``path``; ``error`` naming the file and what it is for otherwise."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{what} {p}: not valid YAML: {exc}") from None
