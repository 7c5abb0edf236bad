"""Where a data reference's uri points: `dataroot://rel/path` under the data root, or
`file:///abs/path`. Its own module, free of the data plane's libraries, so that gate 5 and a
client verb resolve a uri without loading polars."""

from __future__ import annotations

from pathlib import Path

from ito_assets.errors import ErrorCode, ItoError

DATAROOT = "dataroot://"
FILE = "file://"


def resolve_uri(uri: str, data_root: Path) -> Path:
    """`dataroot://rel/path` under the data root (never escaping it), or `file:///abs/path`."""
    if uri.startswith(DATAROOT):
        relative = Path(uri[len(DATAROOT):])
        root = data_root.resolve()
        path = (root / relative).resolve()
        if relative.is_absolute() or not path.is_relative_to(root):
            raise ItoError(ErrorCode.SOURCE_INVALID, "a dataroot:// reference points outside the data root")
        return path
    if uri.startswith(FILE):
        return Path(uri[len(FILE):])
    raise ItoError(ErrorCode.SOURCE_INVALID, "a data reference has an unsupported uri scheme")
