"""What every layer of the tuning package may import, and that imports none of them: the
start-up timeline that the driver and its trial processes mark (``timeline``) and the cheap,
crash-safe commits of a study's local SQLite stores (``sqlite_commits``). Both read only
:mod:`fedtune.tuning.env`."""
