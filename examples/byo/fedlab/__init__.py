"""fedlab: a user project for fedtune (wine task, residual MLP, FedNova with median clipping).

Nothing is registered on ``import fedlab``; the modules register when imported:

* :mod:`fedlab.models`  — ``fedlab_resmlp``, a residual tanh MLP;
* :mod:`fedlab.tasks`   — ``fedlab_wine``, scikit-learn's wine data over label-skewed clients;
* :mod:`fedlab.methods` — ``nova_medclip``, FedNova's normalized averaging with the cohort's
  median update norm as a clipping bound, and server momentum.
"""
