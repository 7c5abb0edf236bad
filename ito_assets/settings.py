"""Settings, read once at the edge (CLI entry, definitions.py) and passed down as a value.

Defaults give the embedded installation: fixtures under data/fixtures, state under .ito/.
Nothing reads the environment at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from ito_assets.manifest.secure_read import DEFAULT_MAX_BYTES

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EVAL_SUITE = "fixtures/evals/ito-fixture-evals-v1.jsonl"
EXECUTORS = ("multiprocess", "in_process", "k8s")


@dataclass(frozen=True, kw_only=True)
class Settings:
    project_root: Path
    state_dir: Path  # .ito/: Dagster instance, ledger, warehouse
    data_root: Path  # `dataroot://` URIs resolve here
    manifests_dir: Path  # reviewed manifests the sensor registers
    eval_suite_path: Path
    max_manifest_bytes: int = DEFAULT_MAX_BYTES
    executor: str = "multiprocess"  # one of EXECUTORS: where a run's steps execute
    ledger_url: str = ""  # SQLAlchemy URL; empty means the SQLite file <state_dir>/ledger.db
    ledger_schema: str | None = None  # PostgreSQL schema holding the ledger's tables
    # The environment variable `ledger_url` came from, if any: Dagster resources name it instead of
    # holding the value, so that a production URL's password never shows in the UI or run config.
    ledger_url_env: str | None = None

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}")
        if not self.ledger_url:
            object.__setattr__(self, "ledger_url", f"sqlite:///{self.state_dir / 'ledger.db'}")

    @property
    def dagster_home(self) -> Path:
        return self.state_dir / "dagster"

    @property
    def warehouse_path(self) -> Path:
        return self.state_dir / "warehouse.duckdb"

    def with_overrides(self, **changes) -> "Settings":
        if "ledger_url" in changes:  # an explicit URL no longer comes from the environment
            changes.setdefault("ledger_url_env", None)
        return replace(self, **changes)


def _path(env: Mapping[str, str], name: str, default: Path) -> Path:
    value = env.get(name)
    return Path(value).resolve() if value else default


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """ITO_STATE_DIR, ITO_DATA_ROOT, ITO_MANIFESTS_DIR, ITO_EVAL_SUITE, ITO_MAX_MANIFEST_BYTES,
    ITO_EXECUTOR, ITO_LEDGER_URL, ITO_LEDGER_SCHEMA."""
    env = os.environ if env is None else env
    root = _path(env, "ITO_PROJECT_ROOT", PROJECT_ROOT)
    data_root = _path(env, "ITO_DATA_ROOT", root / "data")
    max_bytes = env.get("ITO_MAX_MANIFEST_BYTES")
    if max_bytes is not None and not (max_bytes.isdigit() and int(max_bytes) > 0):
        raise ValueError("ITO_MAX_MANIFEST_BYTES must be a positive integer")
    return Settings(
        project_root=root,
        state_dir=_path(env, "ITO_STATE_DIR", root / ".ito"),
        data_root=data_root,
        manifests_dir=_path(env, "ITO_MANIFESTS_DIR", data_root / "fixtures" / "manifests"),
        eval_suite_path=_path(env, "ITO_EVAL_SUITE", data_root / DEFAULT_EVAL_SUITE),
        max_manifest_bytes=int(max_bytes) if max_bytes else DEFAULT_MAX_BYTES,
        executor=env.get("ITO_EXECUTOR", "multiprocess"),
        ledger_url=env.get("ITO_LEDGER_URL", ""),
        ledger_schema=env.get("ITO_LEDGER_SCHEMA") or None,
        ledger_url_env="ITO_LEDGER_URL" if env.get("ITO_LEDGER_URL") else None,
    )
