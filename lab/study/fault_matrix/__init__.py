"""The insulation matrix: every pipeline x every fault it applies to, at a fixed rate.

Three parts, in the order a study uses them: its plan (:mod:`~lab.study.fault_matrix.plan`: the
profiles and one scenario per cell), its run (:mod:`~lab.study.fault_matrix.execution`: the cells
not run before, and the runs a series stored) and its tables (:mod:`~lab.study.fault_matrix.cells`:
one run as one row; :mod:`~lab.study.fault_matrix.tables`: the matrix as tables, figures and
sentences). Their public names are this package's.
"""

from lab.study.fault_matrix.cells import (
    COLUMNS,
    DEAD_CONSUMER,
    backlog_where,
    cell_row,
    delivered_during_pct,
    fault_window,
    recorded,
    slope,
    timeline,
    who_waits,
)
from lab.study.fault_matrix.execution import outcome, run_matrix, stored, stored_series
from lab.study.fault_matrix.plan import (
    HA_KINDS,
    KIND_ORDER,
    LABEL,
    PROFILES,
    FaultProfile,
    candidates,
    cell_label,
    default_series_id,
    inapplicable,
    plan,
    profile,
)
from lab.study.fault_matrix.tables import by_pipeline, lag_figure, matrix_table, reading, shown, wal_figure, wal_table

__all__ = ["COLUMNS", "DEAD_CONSUMER", "HA_KINDS", "KIND_ORDER", "LABEL", "PROFILES", "FaultProfile", "backlog_where",
           "by_pipeline", "candidates", "cell_label", "cell_row", "default_series_id", "delivered_during_pct",
           "fault_window", "inapplicable", "lag_figure", "matrix_table", "outcome", "plan", "profile", "reading",
           "recorded", "run_matrix", "shown", "slope", "stored", "stored_series", "timeline", "wal_figure",
           "wal_table", "who_waits"]
