"""fanout-lab: what it costs to deliver outbox rows from PostgreSQL to N consumers."""

from __future__ import annotations

__version__ = "0.1.0"
