"""Training Selective Attention models: the memory loss and the loss under KV budgets
(:mod:`~rl.selective.losses`), and the per-layer budget search (:mod:`~rl.selective.budgets`)."""
