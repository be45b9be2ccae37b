"""The web's insert statement, sent through libpq directly, is what psycopg would have sent.

The web passes the converted text and parameter types to ``send_query_params`` itself (no
cursor); if psycopg ever converted ``%s`` for a str differently, the wire traffic would no
longer be the one the figures were measured with, and this test says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from lab.workload import web

ROOT = Path(__file__).resolve().parents[3]


def test_insert_text_types_and_formats_are_psycopgs_conversion() -> None:
    q = PostgresQuery(Transformer())
    q.convert(web.INSERT_QUERY, ("helloworld",))
    assert q.query == web.INSERT
    assert tuple(q.types) == web.INSERT_TYPES
    assert tuple(q.formats) == web.INSERT_FORMATS
    assert q.params == [b"helloworld"]  # the parameter is the str's UTF-8 bytes, as the web sends it


@pytest.mark.parametrize("doc", ["docs/method.md", "docs/history/2026-12-01-fidelity-options.md"])
def test_the_docs_name_the_defaults_the_code_has(doc: str) -> None:
    from lab.workload import senders

    text = " ".join((ROOT / doc).read_text().split())  # line breaks do not matter
    assert f"the senders' default client is `{senders.DEFAULT_CLIENT}`" in text
    assert f"the web's default insert listener is `{web.DEFAULT_HTTP}`" in text
    assert web.main.__module__ == "lab.workload.web"
    args = web.parser().parse_args(["--port", "1", "--dsn", "x"])
    assert args.http == web.DEFAULT_HTTP
    assert senders.parser().parse_args(["--url", "u", "--messages", "1", "--out", "o"]).client == senders.DEFAULT_CLIENT


def test_the_recorded_harness_names_the_defaults() -> None:
    from lab.workload import HARNESS, senders

    assert HARNESS.startswith(f"{senders.DEFAULT_CLIENT} senders, {web.DEFAULT_HTTP} insert listener")
