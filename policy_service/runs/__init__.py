"""A training run's pieces below the loop (algorithms/run.py): its directory and files,
the stop criteria, the progress display and TensorBoard writers, signals, and the
resources each role held."""
