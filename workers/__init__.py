"""SpecDeck GPU workers: Celery tasks, leases, supervision and the training pipeline."""
