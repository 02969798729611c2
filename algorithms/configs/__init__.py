"""Each registered algorithm's config class, in a module that imports no TensorFlow: a
Tune driver (algorithms/tune.py) and the registry (`algorithms.get_config_class`) read
them without loading the algorithm. Checking a config still imports Keras and the
exploration types (the activation and exploration rules ask them)."""
