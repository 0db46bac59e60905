"""What every layer of the tuning package may import, and that imports none of them: the
start-up timeline that the driver and its trial processes mark (``timeline``), the cheap,
crash-safe commits of a study's local SQLite stores (``sqlite_commits``), and the cyclic garbage
collector's pause while a process starts (``start_gc``, which imports nothing of fedtune's).
The first two read only :mod:`fedtune.tuning.env`."""
