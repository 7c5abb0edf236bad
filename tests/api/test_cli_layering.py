"""The verb modules sit below the `ito` entry point: none imports ito_assets.api.cli, so the entry
point (which imports every verb) and the verbs form no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import ito_assets.api.commands as commands
from ito_assets.api import cli
from ito_assets.api.commands import readiness

ENTRY = "ito_assets.api.cli"


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):  # function-level (lazy) imports count too
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):  # relative: `from .. import cli` and the like
            names.update(f"<relative>.{alias.name}" for alias in node.names)
            if node.module:
                names.add(f"<relative>.{node.module}")
    return names


def _offenders(names: set[str]) -> set[str]:
    return {n for n in names if n == ENTRY or n.startswith(ENTRY + ".")
            or (n.startswith("<relative>") and n.endswith(".cli"))}


def test_no_verb_module_imports_the_entry_point() -> None:
    files = sorted(Path(commands.__file__).parent.glob("*.py"))
    assert len(files) >= 11  # the package, its ten verb modules and the result type
    offenders = {f.name: sorted(_offenders(_imported(ast.parse(f.read_text(), str(f))))) for f in files}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_check_sees_every_form_of_the_import() -> None:
    for source in ("import ito_assets.api.cli", "from ito_assets.api.cli import run",
                   "from ito_assets.api import cli", "def f():\n    from ito_assets.api.cli import build_parser",
                   "from .. import cli"):
        assert _offenders(_imported(ast.parse(source))), source
    assert not _offenders(_imported(ast.parse("from ito_assets.api.client_config import connect")))


def test_readiness_reads_the_verbs_the_entry_point_registered() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["readiness", "--json"])
    registered = set(parser._subparsers._group_actions[0].choices)  # noqa: SLF001 - argparse lists them nowhere public
    assert readiness.client_verbs(args) == registered and {"train", "readiness", "status"} <= registered
    # A verb's own defaults must not hide the list (argparse copies a subparser's defaults over its parent's).
    train = parser.parse_args(["train", "--booking", "b", "--manifest", "/m", "--confirmation-ref", "c",
                               "--idempotency-key", "k" * 8])
    assert readiness.client_verbs(train) == registered
