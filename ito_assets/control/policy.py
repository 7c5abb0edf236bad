"""The server's policy: where data may come from, which licences allow training, where
tenants keep checkpoints, how long a confirmation lives and how many runs a booking holds.

Built once at the edge (`ito serve`) from the settings read from the environment (settings.py);
passed down as a value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ito_assets import env as env_text
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.secure_read import DEFAULT_MAX_BYTES
from ito_assets.settings import ItoSettings, Settings

# SPDX identifiers of licences whose terms allow use for model training without a separate
# agreement: public-domain dedications and permissive/attribution licences (SPDX License List).
# Non-commercial (-NC) and no-derivatives (-ND) licences are deliberately absent.
DEFAULT_LICENSES = frozenset({
    "CC0-1.0", "PDDL-1.0", "ODC-PDDL-1.0", "CC-BY-4.0", "CC-BY-SA-4.0", "ODC-By-1.0",
    "Apache-2.0", "MIT", "BSD-2-Clause", "BSD-3-Clause", "PSF-2.0",
})
# Short, so an approval cannot be used long after it was given; 10 minutes: enough to read and approve.
DEFAULT_CONFIRMATION_TTL_S = 600
# A booked block is one dedicated training workload at a time unless the desk configures more.
DEFAULT_MAX_CONCURRENT_RUNS = 1


@dataclass(frozen=True, kw_only=True)
class ServerPolicy:
    data_root: Path
    allowed_data_roots: tuple[Path, ...]
    tenants_root: Path
    allowed_licenses: frozenset[str] = DEFAULT_LICENSES
    confirmation_ttl_s: int = DEFAULT_CONFIRMATION_TTL_S
    max_concurrent_runs_per_booking: int = DEFAULT_MAX_CONCURRENT_RUNS
    max_manifest_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        # Each field is a setting of `ito serve`: a refusal names its variable, as policy_from's do.
        if self.confirmation_ttl_s <= 0:
            raise _refused("ITO_CONFIRMATION_TTL_S must be a positive integer")
        if self.max_concurrent_runs_per_booking <= 0:
            raise _refused("ITO_MAX_CONCURRENT_RUNS_PER_BOOKING must be a positive integer")
        if not self.allowed_data_roots:
            raise _refused("ITO_ALLOWED_DATA_ROOTS must name at least one folder")

    def tenant_area(self, account_id: str) -> Path:
        return self.tenants_root / account_id


def _refused(message: str) -> ItoError:
    return ItoError(ErrorCode.USAGE_ERROR, message)


def _positive(text: str | None, name: str, default: int) -> int:
    # Unset gives the default; set, even empty, it must be a positive integer.
    return env_text.parse(text, default=default, whole=True, low=1, empty_is_default=False, message=f"{name} must be a positive integer")


def policy_from(settings: Settings, environment: ItoSettings) -> ServerPolicy:
    """ITO_ALLOWED_DATA_ROOTS (os.pathsep-separated), ITO_ALLOWED_LICENSES (comma-separated),
    ITO_TENANTS_ROOT, ITO_CONFIRMATION_TTL_S, ITO_MAX_CONCURRENT_RUNS_PER_BOOKING, over `settings`."""
    roots = environment.allowed_data_roots
    licenses = environment.allowed_licenses
    tenants = environment.tenants_root
    return ServerPolicy(
        data_root=settings.data_root,
        allowed_data_roots=tuple(Path(p).resolve() for p in roots.split(os.pathsep) if p) if roots
        else (settings.data_root,),
        tenants_root=Path(tenants).resolve() if tenants else settings.state_dir / "tenants",
        allowed_licenses=frozenset(s.strip() for s in licenses.split(",") if s.strip()) if licenses
        else DEFAULT_LICENSES,
        confirmation_ttl_s=_positive(environment.confirmation_ttl_s, "ITO_CONFIRMATION_TTL_S",
                                     DEFAULT_CONFIRMATION_TTL_S),
        max_concurrent_runs_per_booking=_positive(environment.max_concurrent_runs_per_booking,
                                                  "ITO_MAX_CONCURRENT_RUNS_PER_BOOKING", DEFAULT_MAX_CONCURRENT_RUNS),
        max_manifest_bytes=settings.max_manifest_bytes,
    )


def load_policy(settings: Settings, env: Mapping[str, str] | None = None) -> ServerPolicy:
    """The policy over `settings` from `env` (default: the process environment); see policy_from."""
    return policy_from(settings, ItoSettings.read(env))
