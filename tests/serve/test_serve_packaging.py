"""The extras of pyproject.toml: ``serve`` brings everything the server imports, ``all`` every
optional feature. Expected values: the imports the server needs, written here."""

from __future__ import annotations

import re
import tomllib

from conftest import REPO


def _extras() -> dict[str, set[str]]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {name: {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() for req in reqs}
            for name, reqs in doc["project"]["optional-dependencies"].items()}


def test_serve_extra_holds_what_the_server_imports():
    # torch (the model), aiohttp (HTTP), prometheus-client (/metrics)
    assert {"torch", "aiohttp", "prometheus-client"} <= _extras()["serve"]


def test_all_extra_holds_every_optional_feature():
    extras = _extras()
    assert "all" in extras
    features = set().union(*(reqs for name, reqs in extras.items() if name not in ("all", "test")))
    assert features <= extras["all"], sorted(features - extras["all"])
