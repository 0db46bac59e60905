"""One study end to end in its driver process: ``study`` (``run_study``: its phases), the
start-up that runs them side by side (``startup``), Ray's start and stop (``ray_runtime``,
``ray_session``, ``ray_thread``: a start that can be stopped), the user's code shipped to the
trials (``code_shipping``), the checks before any trial (``preflight``), where trials run
(``placement``), the fit (``fit``) and trials in the driver's own process (``in_process``),
the progress line (``progress``) and trial errors (``failures``). The top layer: nothing else
in the tuning package imports it (``docs/explanation/architecture.md`` §1)."""
