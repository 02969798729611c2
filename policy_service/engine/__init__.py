"""The engine: which devices towers go on, the tower stack that takes one SGD
step over them, compiled-call plumbing and fused optimizers."""
