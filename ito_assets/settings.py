"""Settings, read once at the edge (CLI entry, `ito serve`, definitions.py) and passed down as a value.

`ItoSettings` is the one reading of the environment: every ITO_ variable, as text. The typed views
are built from it: `Settings` here (the pipeline's folders and ledger), the gate policy
(control/policy.py) and the server's configuration (api/server.py); their numbers go through
env.parse, the one parsing and error path. A view parses only the variables it uses, so a bad value
fails the commands that read it and no other. The client reads its four variables (api/client_config.py)
through the same env.parse without this module: pydantic-settings' import would slow every `ito status`.

Defaults give the embedded installation: fixtures under data/fixtures, state under .ito/.
Nothing reads the environment at import time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ito_assets import env as env_text
# Where the data plane's work units run: this machine's processes, or a Ray cluster (`RAY_ADDRESS`,
# else a Ray started for the step); the same bytes either way (ito_assets/data/ray_engine.py).
from ito_assets.data.config import ENGINES as DATA_ENGINES
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.secure_read import DEFAULT_MAX_BYTES

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EVAL_SUITE = "fixtures/evals/ito-fixture-evals-v1.jsonl"
EXECUTORS = ("multiprocess", "in_process", "k8s")
# Where the decision run trains its arms by default: the stage worker under the supervisor, as a
# curriculum stage trains, or the trainer's own loop in the Dagster process (no launch: about half
# the time on a laptop). The launchpad's `trainer` still overrides it per run.
DecisionTrainer = Literal["stage_worker", "in_process"]
DECISION_TRAINERS: tuple[str, ...] = get_args(DecisionTrainer)


@dataclass(frozen=True, kw_only=True)
class Settings:
    project_root: Path
    state_dir: Path  # .ito/: Dagster instance, ledger, warehouse
    data_root: Path  # `dataroot://` URIs resolve here
    manifests_dir: Path  # reviewed manifests the sensor registers
    eval_suite_path: Path
    max_manifest_bytes: int = DEFAULT_MAX_BYTES
    executor: str = "multiprocess"  # one of EXECUTORS: where a run's steps execute
    data_engine: str = "local"  # one of DATA_ENGINES: where the data plane's work units run
    decision_trainer: str = "stage_worker"  # one of DECISION_TRAINERS
    # The decision run's defaults for this code location (the run config's fields: a booked
    # cluster's proxy-150m, a laptop's smaller proxy); the launchpad still overrides them per run.
    decision_config: Mapping[str, Any] = field(default_factory=dict)
    # SQLAlchemy URL; empty means the SQLite file <state_dir>/ledger.db. Out of repr: it may carry a password.
    ledger_url: str = field(default="", repr=False)
    ledger_schema: str | None = None  # PostgreSQL schema holding the ledger's tables
    # The environment variable `ledger_url` came from, if any: Dagster resources name it instead of
    # holding the value, so that a production URL's password never shows in the UI or run config.
    ledger_url_env: str | None = None

    def __post_init__(self) -> None:
        _one_of(self.executor, "ITO_EXECUTOR", EXECUTORS)
        _one_of(self.data_engine, "ITO_DATA_ENGINE", DATA_ENGINES)
        _one_of(self.decision_trainer, "ITO_DECISION_TRAINER", DECISION_TRAINERS)
        if not self.ledger_url:
            object.__setattr__(self, "ledger_url", f"sqlite:///{self.state_dir / 'ledger.db'}")

    @property
    def dagster_home(self) -> Path:
        return self.state_dir / "dagster"

    @property
    def warehouse_path(self) -> Path:
        return self.state_dir / "warehouse.duckdb"

    @property
    def data_manifests_dir(self) -> Path:
        """Data manifests written by `ito data prepare`: out of the sensor's inbox (they are
        prepared by the command, never trained), found here by their partition key."""
        return self.state_dir / "data-manifests"

    def with_overrides(self, **changes) -> "Settings":
        if "ledger_url" in changes:  # an explicit URL no longer comes from the environment
            changes.setdefault("ledger_url_env", None)
        return replace(self, **changes)


def _one_of(value: str, variable: str, choices: tuple[str, ...]) -> None:
    # A setting the command cannot run with is the caller's to fix: USAGE_ERROR, never the value.
    if value not in choices:
        raise ItoError(ErrorCode.USAGE_ERROR, f"{variable} must be one of {', '.join(choices)}")


class ItoSettings(BaseSettings):
    """Every ITO_ variable as set (None when unset; an empty value stays empty, as some variables
    treat it differently from unset). Only the environment is read: no .env file, no secrets folder."""

    model_config = SettingsConfigDict(env_prefix=env_text.PREFIX, case_sensitive=False, frozen=True, extra="ignore")

    # Settings: the pipeline's folders, limits and ledger.
    project_root: str | None = None
    state_dir: str | None = None
    data_root: str | None = None
    manifests_dir: str | None = None
    eval_suite: str | None = None
    max_manifest_bytes: str | None = None
    executor: str | None = None
    data_engine: str | None = None
    decision_trainer: str | None = None
    decision_config: str | None = None
    ledger_url: str | None = Field(default=None, repr=False)  # may carry a database password
    ledger_schema: str | None = None
    # The gate policy (control/policy.py).
    allowed_data_roots: str | None = None
    allowed_licenses: str | None = None
    tenants_root: str | None = None
    confirmation_ttl_s: str | None = None
    max_concurrent_runs_per_booking: str | None = None
    # `ito serve` (api/server.py).
    ledger_lock_timeout_s: str | None = None
    api_read_timeout_s: str | None = None
    api_max_connections_per_client: str | None = None
    # The client (api/client_config.py reads these four itself, through env.parse).
    api_url: str | None = None
    token_file: str | None = None
    connect_timeout_s: str | None = None
    timeout_s: str | None = None

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        # Only what `read` hands over: callers and tests pass their own mapping, and the process
        # environment is read in one place (`env.environment`), never behind their back.
        return (init_settings,)

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> "ItoSettings":
        """The settings from `env` (default: the process environment). Only upper-case names count
        (ITO_STATE_DIR, not ito_state_dir), as they always have."""
        prefix = len(env_text.PREFIX)
        given = {name[prefix:].lower(): value for name, value in env_text.environment(env).items()
                 if name.startswith(env_text.PREFIX) and name == name.upper()}
        return cls(**{name: value for name, value in given.items() if name in cls.model_fields})

    @staticmethod
    def variable(field: str) -> str:
        return env_text.PREFIX + field.upper()


def _path(value: str | None, default: Path) -> Path:
    return Path(value).resolve() if value else default


def _json_object(value: str | None, variable: str) -> dict[str, Any]:
    """A JSON object's text as a dict (empty when unset or empty); its fields are checked where they
    are used (definitions.py checks the decision's against its run config)."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ItoError(ErrorCode.USAGE_ERROR, f"{variable} must be a JSON object")
    return parsed


def settings_from(environment: ItoSettings) -> Settings:
    """The pipeline's settings: ITO_PROJECT_ROOT, ITO_STATE_DIR, ITO_DATA_ROOT, ITO_MANIFESTS_DIR,
    ITO_EVAL_SUITE, ITO_MAX_MANIFEST_BYTES, ITO_EXECUTOR, ITO_DATA_ENGINE, ITO_DECISION_TRAINER,
    ITO_DECISION_CONFIG, ITO_LEDGER_URL, ITO_LEDGER_SCHEMA."""
    e = environment
    root = _path(e.project_root, PROJECT_ROOT)
    data_root = _path(e.data_root, root / "data")
    return Settings(
        project_root=root,
        state_dir=_path(e.state_dir, root / ".ito"),
        data_root=data_root,
        manifests_dir=_path(e.manifests_dir, data_root / "fixtures" / "manifests"),
        eval_suite_path=_path(e.eval_suite, data_root / DEFAULT_EVAL_SUITE),
        max_manifest_bytes=env_text.parse(e.max_manifest_bytes, default=DEFAULT_MAX_BYTES, whole=True, low=1,
                                          empty_is_default=False, message="ITO_MAX_MANIFEST_BYTES must be a positive integer"),
        executor="multiprocess" if e.executor is None else e.executor,
        data_engine="local" if e.data_engine is None else e.data_engine,
        decision_trainer="stage_worker" if e.decision_trainer is None else e.decision_trainer,
        decision_config=_json_object(e.decision_config, "ITO_DECISION_CONFIG"),
        ledger_url=e.ledger_url or "",
        ledger_schema=e.ledger_schema or None,
        ledger_url_env="ITO_LEDGER_URL" if e.ledger_url else None,
    )


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The pipeline's settings from `env` (default: the process environment); see settings_from."""
    return settings_from(ItoSettings.read(env))
