"""One study end to end in its driver process: ``study`` (``run_study``: its phases), the
start-up that runs them side by side (``startup``, ``timeline``), Ray's start and stop
(``ray_runtime``, ``ray_session``, ``ray_thread``: a start that can be stopped), the user's
code shipped to the trials (``code_shipping``), the checks before any trial (``preflight``),
the progress line (``progress``), trial errors (``failures``) and the local stores' commits
(``sqlite_commits``)."""
