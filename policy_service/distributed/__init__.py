"""The Ray side: the inference PolicyActor and its request batching, rollout
workers and their group, Ray job submission, and facts about the Ray process.

Nothing here imports TensorFlow at package import, so `policy-service submit`
stays light."""
