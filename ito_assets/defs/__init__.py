"""The Dagster shell: one folder per domain, each exporting its own definitions. Thin: assets
fetch resources and partition keys, call the core, and report metadata."""

import warnings

import dagster as dg

# The edge of the definitions we own: every process that loads them (the code location, each step
# of a multiprocess run, `ito data prepare`, a test) comes through here first. Partitioned asset
# checks are a Dagster preview feature we rely on knowingly; its warning, raised as each of our
# checks is defined, would otherwise repeat in every such process's log. Ignored while our
# domains load only, not for anyone else's code.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    from ito_assets.defs import data, decision, manifest, posttraining, telemetry, training, workload  # noqa: E402, F401
