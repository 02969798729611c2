"""Data: columnar batches, their spaces and nests, sequences and the unit layout of a
train batch, observation filters. Imports nothing above it but the root's config and
errors, and neither TensorFlow graphs nor Ray."""
