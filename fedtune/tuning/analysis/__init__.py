"""What a study's trials mean: the convergence–accuracy trade-off (``tradeoff``; ``report``: a
finished study's files), comparisons between studies (``compare``, ``compare_render``), the
figures (``figure``, ``figure_png``, ``plots``) and the quadratic theory's predictions
(``theory_link``). No MLflow and no Optuna here: recording is ``mlflow/``'s, the stored trials
``optuna/``'s."""
