"""Secrets per stack: generated once, 0600, overridable, never in a DSN."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from lab.settings import Settings, settings_env


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_once_private_and_per_stack(tmp_path: Path) -> None:
    a = Settings(stack_dir=tmp_path / "a")
    pg, mq = a.secret("pg"), a.secret("rabbitmq")
    assert len(pg) >= 24 and pg != mq and pg != "lab"
    assert Settings(stack_dir=tmp_path / "a").secret("pg") == pg  # stable for the stack
    assert Settings(stack_dir=tmp_path / "b").secret("pg") != pg  # another stack, another one
    assert _mode(a.secrets_dir) == 0o700 and _mode(a.secrets_dir / "secrets.json") == 0o600


def test_dsn_names_a_private_passfile(tmp_path: Path) -> None:
    s = Settings(stack_dir=tmp_path, pg_port=31234)
    assert "password" not in s.pg_dsn and s.secret("pg") not in s.pg_dsn
    passfile = Path(s.pg_dsn.split("passfile=")[1])
    assert _mode(passfile) == 0o600
    assert passfile.read_text() == f"127.0.0.1:*:*:postgres:{s.secret('pg')}\n"
    _ = s.replace(pg_port=31235).pg_dsn  # a copy on another port leaves the file valid for both
    assert passfile.read_text() == f"127.0.0.1:*:*:postgres:{s.secret('pg')}\n"


def test_override_wins_and_reaches_children(tmp_path: Path) -> None:
    s = Settings.from_env({"LAB_STACK_DIR": str(tmp_path), "LAB_PG_PASSWORD": "a:b\\c"})
    assert s.secret("pg") == "a:b\\c"
    assert s.pg_passfile.read_text().endswith(":postgres:a\\:b\\\\c\n")  # libpq escapes
    assert settings_env(s)["LAB_PG_PASSWORD"] == "a:b\\c"
    assert "LAB_PG_PASSWORD" not in settings_env(Settings(stack_dir=tmp_path))


def test_concurrent_first_use_agrees(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; from lab.settings import Settings; "
            "print(Settings(stack_dir=Path(sys.argv[1])).secret('pg'))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    assert len({p.communicate()[0] for p in procs}) == 1


def test_connect_env_prints_no_secret(tmp_path: Path) -> None:
    s = Settings(stack_dir=tmp_path)
    env = s.connect_env()
    text = "\n".join(env.values())
    assert s.secret("pg") not in text and s.secret("rabbitmq") not in text
    assert env["PGPASSFILE"] == str(s.pg_passfile) and env["AMQP_URL"].startswith("amqp://lab@")
    url_file = Path(env["AMQP_URL_FILE"])
    assert _mode(url_file) == 0o600 and url_file.read_text().strip() == s.amqp_url


def test_ha_clients_list_the_standby_and_ask_for_a_primary(tmp_path: Path) -> None:
    """Under ha every client's DSN names the primary and the standby, and libpq keeps only a
    read-write server (so after a promotion a new connection finds the new primary); the stack's
    own DSN of the primary, and the single topology's, name one server."""
    from psycopg.conninfo import conninfo_to_dict

    single = Settings(stack_dir=tmp_path, pg_port=31234)
    ha = single.replace(topology="ha")
    parsed = conninfo_to_dict(ha.pg_dsn)  # libpq's own parser
    assert parsed["host"] == "127.0.0.1,127.0.0.1" and parsed["port"] == "31234,31235"
    assert parsed["target_session_attrs"] == "read-write"
    assert single.pg_dsn == single.pg_primary_dsn == ha.pg_primary_dsn
    assert conninfo_to_dict(ha.pg_primary_dsn)["port"] == "31234"
    assert "target_session_attrs" not in conninfo_to_dict(single.pg_dsn)
    assert s_secret_free(ha)


def s_secret_free(s: Settings) -> bool:
    return "password" not in s.pg_dsn and s.secret("pg") not in s.pg_dsn
