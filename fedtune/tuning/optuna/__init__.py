"""The study's search in Optuna: the searcher Ray Tune asks (``search``), the study's storage
(``store``) and the configuration-round ledger a budget in compute keeps (``budget``)."""
