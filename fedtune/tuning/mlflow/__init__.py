"""Everything a study writes to MLflow: its runs and their curves (``tracking``, ``round_log``,
``step_points``), its local store (``store``, ``sqlite_template``), links into the UI
(``urls``) and a comparison recorded as a run (``comparisons``). The only part of the tuning
package that imports MLflow."""
