"""Everything a study writes to MLflow: its runs and their curves (``tracking``, ``callback``,
``round_log``, ``step_points``), its store (``client``, ``store``, ``sqlite_template``), links
into the UI (``urls``) and a comparison recorded as a run (``comparisons``). The only part of
the tuning package that imports MLflow."""
