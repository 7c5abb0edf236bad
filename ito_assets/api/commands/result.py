"""What a verb hands back to the `ito` entry point (api/cli.py), kept below both so that no verb
module imports the entry point that imports it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class VerbResult:
    """What a verb returns: the envelope's data, and whether any byte reached the API."""

    data: dict[str, Any]
    live_api_contacted: bool = False
    notice: str | None = None
    text: list[str] = field(default_factory=list)  # readable lines for the non-JSON mode


Handler = Callable[[argparse.Namespace], VerbResult]
