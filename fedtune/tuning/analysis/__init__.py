"""What a study's trials mean: the convergence–accuracy trade-off (``tradeoff``, ``report``),
comparisons between studies (``compare``, ``compare_runs``, ``compare_render``), the figures
(``figure``, ``figure_png``, ``plots``, ``step_points``) and the quadratic theory's predictions
(``theory_link``). No MLflow here except ``compare_runs``, which records a comparison."""
