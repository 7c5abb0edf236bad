"""Shared resources, built once in definitions.py under fixed keys and asked for by name."""


from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import dagster as dg
from pydantic import ConfigDict

from ito_assets.control.ledger import Ledger, open_ledger
from ito_assets.settings import Settings

# The Dagster pool every asset that writes the DuckDB warehouse runs in: DuckDB has one writer at a
# time, so the writers queue here rather than fail on the file lock.
WAREHOUSE_POOL = "duckdb_writer"


class StrictResource(dg.ConfigurableResource):
    """A resource that refuses a field it does not have. Run configuration is checked by Dagster's
    own schema; a resource built in Python (definitions.py, a deployment's code) would otherwise
    drop a misspelt or retired field without a word and run with its default."""

    model_config = ConfigDict(extra="forbid")


class ItoSettingsResource(StrictResource):
    """The settings object of `ito_assets.settings`, as a Dagster resource (key `ito`)."""

    project_root: str
    state_dir: str
    data_root: str
    manifests_dir: str
    eval_suite_path: str
    max_manifest_bytes: int
    data_engine: str = "local"  # where the data plane's work units run (ITO_DATA_ENGINE)

    @classmethod
    def from_settings(cls, settings: Settings) -> "ItoSettingsResource":
        return cls(
            project_root=str(settings.project_root),
            state_dir=str(settings.state_dir),
            data_root=str(settings.data_root),
            manifests_dir=str(settings.manifests_dir),
            eval_suite_path=str(settings.eval_suite_path),
            max_manifest_bytes=settings.max_manifest_bytes,
            data_engine=settings.data_engine,
        )

    def settings(self) -> Settings:
        return Settings(
            project_root=Path(self.project_root),
            state_dir=Path(self.state_dir),
            data_root=Path(self.data_root),
            manifests_dir=Path(self.manifests_dir),
            eval_suite_path=Path(self.eval_suite_path),
            max_manifest_bytes=self.max_manifest_bytes,
            data_engine=self.data_engine,
        )


class LedgerResource(StrictResource):
    """The ledger of bookings, confirmations and runs (key `ledger`): the same database the
    canonical API writes, opened per use so that no connection outlives a step.

    A URL read from the environment stays `dg.EnvVar("ITO_LEDGER_URL")`: the UI and the run config
    show the variable's name, never the URL with its password."""

    url: str
    db_schema: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "LedgerResource":
        url = dg.EnvVar(settings.ledger_url_env) if settings.ledger_url_env else settings.ledger_url
        return cls(url=url, db_schema=settings.ledger_schema)

    @contextmanager
    def open(self) -> Iterator[Ledger]:
        # Dagster resolves the variable for a step; a direct caller (make run) holds the EnvVar.
        url = self.url.get_value() if isinstance(self.url, dg.EnvVar) else self.url
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        ledger = open_ledger(url, schema=self.db_schema)
        try:
            yield ledger
        finally:
            ledger.dispose()
