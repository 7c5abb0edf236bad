"""Tests of ito_assets.posttraining and its Dagster assets (a package: unique module names)."""
