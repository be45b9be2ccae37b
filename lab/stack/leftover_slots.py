"""The replication slots a stack leaves behind. ``down`` drops every slot of the stack's private
cluster (a killed run's readers' or Debezium's): a slot left while the stack is down would pin WAL
at the next start. When the host layout is not routed any more (PostgreSQL's address would lead off
the machine) the drop is recorded instead (:func:`pending`), and the next ``up`` drops them once
PostgreSQL is reached (:func:`drop_pending`)."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg

from lab.pg import slots
from lab.settings import Settings
from lab.stack import hosts

log = logging.getLogger(__name__)


def pending(settings: Settings) -> Path:
    """The record of slots a ``down`` could not drop (the host layout was not routed then)."""
    return settings.stack_dir / "slots.pending"


def drop_all(settings: Settings, errors: list[str]) -> None:
    """Drop every replication slot of the running cluster; a failure is added to ``errors``."""
    if settings.netns and not hosts.routed(settings):  # its address leads off the machine now
        # recorded: the next `up` drops them once PostgreSQL is reached again (they pin its WAL)
        pending(settings).write_text(f"{hosts.NOT_UP}\n")
        log.warning("replication slots not dropped (%s): the next `lab stack up` drops them", hosts.NOT_UP)
        return
    try:
        dropped = slots.drop_slots(settings.pg_primary_dsn, "")
    except psycopg.OperationalError as exc:
        if not missing_database(str(exc), settings.pg_database):
            errors.append(f"replication slots: {exc}")
        else:  # an `up` killed before it created the database, and before any slot
            log.info("no replication slots to drop: database %s does not exist yet", settings.pg_database)
    except Exception as exc:
        errors.append(f"replication slots: {exc}")
    else:
        if dropped:
            log.info("dropped replication slots %s", ", ".join(dropped))


def drop_pending(settings: Settings) -> None:
    """Drop the slots a ``down`` left (:func:`pending`), now that PostgreSQL is reached."""
    if not pending(settings).exists():
        return
    dropped = slots.drop_slots(settings.pg_primary_dsn, "")
    log.info("dropped the replication slots an earlier `down` could not: %s", ", ".join(dropped) or "none")
    pending(settings).unlink(missing_ok=True)


def missing_database(error: str, database: str) -> bool:
    """Whether a connection ``error`` says that ``database`` does not exist (the server's FATAL at
    login; psycopg gives a connection's failure no SQLSTATE)."""
    return f'database "{database}" does not exist' in error
