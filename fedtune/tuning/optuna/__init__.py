"""The study's search in Optuna: the searcher Ray Tune asks (``search``), the study's storage
(``store``), the configuration-round ledger a budget in compute keeps (``budget``) and the table
of the stored trials that MLflow shows (``trials_table``)."""
