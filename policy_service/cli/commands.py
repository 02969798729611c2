"""The `policy-service` command line: train, evaluate, export, submit.

Only argument parsing lives here; each subcommand calls one module:
train -> policy_service.cli.training, evaluate/export -> algorithms.evaluation,
submit -> policy_service.distributed.jobs, config -> policy_service.cli.config_listing.
Bad input (a UserError) ends in one line on stderr and exit status 2, a run that
cannot go on (a RunFailure) in one line and status 1; modules are imported lazily
so `submit` never loads TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from policy_service.errors import RunFailure, UserError

PROG = "policy-service"
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its native start-up lines kept off stderr ("oneDNN
    custom operations are on", "Could not find cuda drivers"): they would bury a
    one-line error. Shown after all if the import fails, and with
    TF_CPP_MIN_LOG_LEVEL=0 (quiet_tensorflow; Ray workers get the same)."""
    from policy_service.distributed import quiet_tensorflow

    quiet_tensorflow.import_quietly()


def _train(args: argparse.Namespace) -> int:
    from policy_service.cli.run_config import check_algorithm_name

    if not args.resume:  # a resumed run names its algorithm in its directory
        check_algorithm_name(args.algorithm)
    import_tensorflow_quietly()
    from policy_service.cli import training
    from policy_service.cli.run_options import RunOptions, StopCriteria
    from policy_service.cli.user_modules import import_user_modules

    import_user_modules(args.imports, to_ray_workers=True)

    options = RunOptions(
        algorithm=args.algorithm,
        env=args.env,
        config_file=args.config,
        overrides=args.set or [],
        num_gpus=args.num_gpus,
        fake_gpus=args.fake_gpus,
        num_env_runners=args.num_env_runners,
        num_learners=args.num_learners,
        gpus_per_learner=args.gpus_per_learner,
        seed=args.seed,
        stop=StopCriteria(
            reward=args.stop_reward,
            timesteps=args.stop_timesteps,
            iters=args.stop_iters,
            seconds=args.stop_time,
        ),
        output_dir=args.output_dir,
        resume=args.resume,
        address=args.address,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        external_env=args.external_env,
        host=args.host,
        port=args.port,
        token_file=args.token_file,
        input=args.input,
    )
    return training.train(options)


def _evaluate(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()
    from algorithms import evaluation
    from policy_service.cli.user_modules import import_user_modules

    import_user_modules(args.imports)

    return evaluation.evaluate(
        args.checkpoint,
        episodes=args.episodes,
        env=args.env,
        explore=args.explore,
        seed=args.seed,
        policy_id=args.policy,
    )


def _export(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()
    from algorithms import evaluation
    from policy_service.cli.user_modules import import_user_modules

    import_user_modules(args.imports)
    _check_export_writable(args.out, evaluation.ExportTargetError)
    return evaluation.export(
        args.checkpoint, args.out, onnx_opset=args.onnx, force=args.force, policy_id=args.policy
    )


def _check_export_writable(out: str, error: type[Exception]) -> None:
    """The export can be written beside `out` (it is written in a temp dir there, then
    renamed): a probe dir made and removed in the nearest directory that exists, as
    `train --output-dir` checks; a file on the way is left to the export's own check."""
    existing = Path(out).absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return
    try:  # permissions, a read-only or full disk, a filesystem that takes no new entries
        os.rmdir(tempfile.mkdtemp(prefix=".policy-service-probe-", dir=existing))
    except OSError as err:
        raise error(f"--out {out}: cannot write in {existing} ({err.strerror or err})") from None


def _config(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()  # the algorithms' modules import it
    from policy_service.cli.config_listing import print_config

    return print_config(args.algorithm)


def _submit(args: argparse.Namespace) -> int:
    from policy_service.distributed import jobs  # no TensorFlow on this path

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    address = args.address or jobs.default_address()
    if not address:
        raise jobs.JobSubmissionError(
            "no cluster address: pass --address http://HEAD:8265 (or set RAY_ADDRESS)"
        )
    return jobs.run_job(
        address,
        command,
        wait=not args.no_wait,
        working_dir=args.working_dir,
        insecure=args.insecure,
        resources=jobs.EntrypointResources(args.num_gpus, args.num_cpus),
    )


def _serve(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()  # algorithms imports it; the replicas build the policy
    from algorithms import saved_policies
    from policy_service.io.checkpoints import newest_loadable
    from policy_service.serving import server
    from policy_service.serving.deployment import ServingSettings
    from policy_service.serving.http_api import DEFAULT_MAX_REQUEST_BYTES

    address = server.ServerAddress(args.host, args.port)
    settings = ServingSettings(
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_timeout_s,
        max_request_bytes=(
            DEFAULT_MAX_REQUEST_BYTES if args.max_request_bytes is None else args.max_request_bytes
        ),
        num_replicas=args.num_replicas,
        num_gpus_per_replica=args.num_gpus,
        access_log=args.access_log,
    )
    server.check_settings(address, settings)
    found, state = newest_loadable(
        saved_policies.checkpoint_candidates(args.checkpoint),
        lambda d: saved_policies.saved_policy_state(saved_policies.locate_one(d, args.policy)),
        args.checkpoint,
        skipped=(saved_policies.CheckpointError,),
        fatal=(saved_policies.PolicyChoiceError,),
    )
    token, where = server.resolve_token(args.token_file, os.environ, server.serve_directory(found))
    announce = f"policy {found}; token from {where}"
    if args.log_experiences:  # the episode API too, every step written (experience_logging)
        from policy_service.serving import experience_logging

        app, close = experience_logging.from_arguments(args, state, token, settings)
        announce += f"; logging experiences to {args.log_experiences}"
        return server.run_server(
            state, address, settings, token, announce=announce, app=app, before_stop=close
        )
    return server.run_server(state, address, settings, token, announce=announce)


def _estimate(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()
    from policy_service.cli import estimate_command

    return estimate_command.run(args)


def _tune(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()
    from policy_service.cli.tune_command import TuneOptions, tune
    from policy_service.cli.user_modules import import_user_modules

    import_user_modules(args.imports, to_ray_workers=True)
    return tune(
        TuneOptions(
            algorithm=args.algorithm,
            env=args.env,
            config_file=args.config,
            search_file=args.search,
            num_samples=args.num_samples,
            scheduler=args.scheduler,
            max_concurrent=args.max_concurrent,
            resume=args.resume,
            address=args.address,
            stop_reward=args.stop_reward,
            stop_iters=args.stop_iters,
            stop_timesteps=args.stop_timesteps,
            output_dir=args.output_dir,
            metric=args.metric,
            checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            perturbation_interval=args.perturbation_interval,
            mlflow_uri=args.mlflow_uri,
            wandb_project=args.wandb_project,
        )
    )


def _add_tune_parser(sub) -> None:
    tune = sub.add_parser(
        "tune",
        help="sweep an algorithm's config with Ray Tune (grid, random, ASHA, PBT)",
        description="Run a Ray Tune sweep of ALGO: the --config keys with the --search "
        "space's leaves over them (YAML: key: {grid_search|choice: [...]} or "
        "{uniform|loguniform|randint: [low, high]}). Prints a progress table, then the "
        "best trial, its config and its checkpoint (which evaluate, export and serve take).",
    )
    tune.add_argument(
        "algorithm", nargs="?", metavar="ALGO", help="e.g. ppo (optional with --resume)"
    )
    tune.add_argument("--env", help="gymnasium environment id, e.g. CartPole-v1")
    tune.add_argument("--config", metavar="FILE", help="YAML or JSON file of fixed config keys")
    tune.add_argument("--search", metavar="FILE", help="YAML file of the search space")
    tune.add_argument("--num-samples", type=int, default=1, help="samples of the space (default 1)")
    tune.add_argument(
        "--scheduler",
        default="fifo",
        help="fifo (default), asha (stops poor trials early) or pbt (population-based "
        "training over the search space's keys)",
    )
    tune.add_argument("--max-concurrent", type=int, metavar="N", help="trials at once")
    tune.add_argument(
        "--resume", metavar="D", help="continue the sweep in D (finished trials stay done)"
    )
    tune.add_argument("--address", metavar="A", help="join this Ray cluster (default: local)")
    tune.add_argument("--stop-reward", type=float, help="stop a trial at this --metric")
    tune.add_argument("--stop-iters", type=int, help="stop a trial after this many iterations")
    tune.add_argument("--stop-timesteps", type=int, help="stop a trial after this many env steps")
    tune.add_argument(
        "--output-dir", metavar="D", help="sweep directory (default runs/tune-ALGO-ENV-TIME)"
    )
    tune.add_argument("--metric", default="episode_return_mean", help="what best means (maximized)")
    tune.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="checkpoint every N iterations (default: at the end)",
    )
    tune.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        metavar="K",
        help="best K checkpoints kept per trial",
    )
    tune.add_argument(
        "--perturbation-interval",
        type=int,
        default=4,
        metavar="N",
        help="pbt: iterations between exploits (default 4)",
    )
    tune.add_argument("--mlflow-uri", metavar="URI", help="also log to MLflow (mlflow installed)")
    tune.add_argument("--wandb-project", metavar="P", help="also log to W&B (wandb installed)")
    _add_import_argument(tune)
    tune.set_defaults(handler=_tune)


def _add_serve_parser(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve a checkpoint's policy over HTTP (JSON) on Ray Serve",
        description="Serve the policy in CHECKPOINT: GET /v1/health, GET /v1/spec, POST "
        "/v1/actions, every path but health with 'Authorization: Bearer TOKEN'. Runs "
        "until SIGTERM or SIGINT.",
    )
    serve.add_argument("checkpoint", metavar="CHECKPOINT")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    _add_policy_argument(serve)
    serve.add_argument("--port", type=int, default=9900, help="HTTP port (default 9900)")
    serve.add_argument("--num-replicas", type=int, default=1, help="Serve replicas (default 1)")
    serve.add_argument(
        "--num-gpus",
        type=float,
        default=0.0,
        help="GPUs per replica; its policy acts on them (default 0)",
    )
    serve.add_argument(
        "--token-file",
        metavar="F",
        help="file holding the bearer token (default: $POLICY_SERVICE_TOKEN, "
        "else one is generated into the run's serve/ directory)",
    )
    serve.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="rows per forward pass across concurrent requests (default 32)",
    )
    serve.add_argument(
        "--batch-wait-timeout-s",
        type=float,
        default=0.001,
        help="longest wait for requests to join a pass (default 0.001)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="Serve's log line per request in the replica's log (default: off)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        metavar="N",
        help="larger request bodies get 413 (default 4 MiB)",
    )
    serve.add_argument(
        "--log-experiences",
        metavar="DIR",
        help="also serve the episode API (policy_service.client.PolicyClient) and write every "
        "step the clients complete to DIR, with the policy's action_logp (one replica)",
    )
    serve.add_argument(
        "--log-format", default="parquet", help="parquet (default) or json (RLlib's JSON lines)"
    )
    serve.add_argument(
        "--log-max-file-size", type=int, metavar="BYTES", help="start the next file past it"
    )
    serve.set_defaults(handler=_serve)


def _import_rllib(args: argparse.Namespace) -> int:
    import_tensorflow_quietly()
    from policy_service.cli.import_command import import_rllib
    from policy_service.cli.user_modules import import_user_modules

    import_user_modules(args.imports)
    return import_rllib(
        args.checkpoint,
        algo=args.algo,
        env=args.env,
        out=args.out,
        policy_id=args.policy,
        weight_map_file=args.weight_map,
    )


def _add_import_rllib_parser(sub) -> None:
    parser = sub.add_parser(
        "import-rllib",
        help="an RLlib old-stack checkpoint as a run directory here",
        description="Read an RLlib (old API stack, TF) checkpoint without running its "
        "pickles and write DIR as a run directory whose checkpoint evaluate, export, "
        "serve and train --resume take.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT")
    parser.add_argument("--algo", default="ppo", help="algorithm here (default ppo)")
    parser.add_argument("--env", required=True, help="environment id the policy acts in")
    parser.add_argument("--out", required=True, metavar="DIR", help="run directory to write")
    parser.add_argument(
        "--weight-map",
        metavar="FILE",
        help="JSON {RLlib variable name: ours or null}, for a custom model",
    )
    _add_policy_argument(parser)
    _add_import_argument(parser)
    parser.set_defaults(handler=_import_rllib)


def _add_import_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="import MODULE first (searched from the current directory too), so the "
        "custom models, environments and policy classes it registers are known; repeatable",
    )


def _add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        metavar="ID",
        help="the policy of a multi-agent checkpoint (required there; its ids are "
        "listed when it is missing)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Train, evaluate, export and submit TF2 RL policies on Ray."
    )
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    train = sub.add_parser(
        "train",
        help="train an algorithm on an environment",
        description="Train ALGO on ENV; writes progress.jsonl, result.json, "
        "config.json, checkpoints/ and tensorboard/ under --output-dir.",
    )
    train.add_argument(
        "algorithm",
        nargs="?",
        metavar="ALGO",
        help="algorithm name, e.g. ppo (optional with --resume)",
    )
    train.add_argument("--env", help="gymnasium environment id, e.g. CartPole-v1")
    train.add_argument(
        "--input",
        metavar="DIR",
        help="train from logged experiences (a directory or glob of Parquet or JSON-lines "
        "files) instead of env runners; --env is then optional (evaluation only)",
    )
    train.add_argument("--config", metavar="FILE", help="YAML or JSON file of config keys")
    train.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override one config key (YAML value; dotted keys nest, "
        "e.g. model.fcnet_hiddens=[64,64]); repeatable",
    )
    train.add_argument("--num-gpus", type=float, help="towers: GPUs for the learner")
    train.add_argument(
        "--fake-gpus",
        action="store_true",
        default=None,
        help="with no GPU, put the towers on separate logical CPU devices",
    )
    train.add_argument("--num-env-runners", type=int, help="rollout worker actors")
    train.add_argument(
        "--num-learners",
        type=int,
        help="learner actors training one policy (0: the learner runs here)",
    )
    train.add_argument(
        "--gpus-per-learner",
        type=float,
        help="GPUs Ray reserves for each learner actor (its towers)",
    )
    train.add_argument("--stop-reward", type=float, help="stop at this episode_return_mean")
    train.add_argument("--stop-timesteps", type=int, help="stop after this many env steps")
    train.add_argument("--stop-iters", type=int, help="stop after this many iterations")
    train.add_argument(
        "--stop-time",
        type=float,
        metavar="SECONDS",
        help="stop after this many seconds of training (time_total_s, counted over resumes)",
    )
    train.add_argument(
        "--output-dir", metavar="D", help="run directory (default runs/ALGO-ENV-TIME)"
    )
    train.add_argument(
        "--resume",
        metavar="D",
        help="continue the run in D from its latest checkpoint, same config",
    )
    train.add_argument(
        "--address",
        metavar="A",
        help="join this Ray cluster (default: $RAY_ADDRESS, set inside Ray "
        "jobs); without one, a local Ray is started if the run has actors",
    )
    train.add_argument("--seed", type=int, help="random seed")
    train.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="N",
        help="checkpoint every N iterations (default 10; always at the end)",
    )
    train.add_argument(
        "--keep-checkpoints",
        type=int,
        metavar="K",
        help="keep the latest K checkpoints (default 3)",
    )
    train.add_argument(
        "--external-env",
        action="store_true",
        default=None,
        help="train from episodes that clients outside Ray send over HTTP "
        "(policy_service.client.policy_client.PolicyClient); --env then only gives the spaces",
    )
    train.add_argument(
        "--host", help="with --external-env: address to listen on (default 127.0.0.1)"
    )
    train.add_argument("--port", type=int, help="with --external-env: HTTP port (default 9900)")
    train.add_argument(
        "--token-file",
        metavar="F",
        help="with --external-env: file holding the clients' bearer token (default: "
        "$POLICY_SERVICE_TOKEN, else one is generated into the run's serve/ directory)",
    )
    _add_import_argument(train)
    train.set_defaults(handler=_train)

    evaluate = sub.add_parser(
        "evaluate",
        help="run episodes with a checkpoint's policy",
        description="Run episodes with the policy in CHECKPOINT (a run "
        "directory, a checkpoint or a policy directory) and print one "
        "JSON line of episode statistics.",
    )
    evaluate.add_argument("checkpoint", metavar="CHECKPOINT")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    evaluate.add_argument("--env", help="environment id (default: the one trained on)")
    evaluate.add_argument(
        "--explore", action="store_true", help="sample actions instead of acting deterministically"
    )
    evaluate.add_argument(
        "--seed",
        type=int,
        help="episode i's environment seed is SEED + i (default: the run's seed, as its "
        "evaluations during training use, else 0)",
    )
    _add_policy_argument(evaluate)
    _add_import_argument(evaluate)
    evaluate.set_defaults(handler=_evaluate)

    export = sub.add_parser("export", help="export a checkpoint's policy as a SavedModel")
    export.add_argument("checkpoint", metavar="CHECKPOINT")
    export.add_argument("--out", required=True, metavar="DIR", help="SavedModel directory")
    export.add_argument("--onnx", type=int, metavar="OPSET", help="also write model.onnx")
    export.add_argument(
        "--force",
        action="store_true",
        help="replace what is at --out (a file, or a directory that is not "
        "empty); the old one stays if the export fails",
    )
    _add_policy_argument(export)
    _add_import_argument(export)
    export.set_defaults(handler=_export)

    config = sub.add_parser(
        "config",
        help="list an algorithm's config keys with defaults, docs and allowed values",
        description="Print every config key of ALGO as YAML: its default, under a "
        "comment with its doc and allowed values (a copy is a valid --config FILE).",
    )
    config.add_argument("algorithm", metavar="ALGO", help="algorithm name, e.g. ppo")
    config.set_defaults(handler=_config)

    submit = sub.add_parser(
        "submit",
        help="run a command as a Ray job on a cluster",
        description="Run COMMAND as a Ray job, stream its log and exit "
        "with its status (0 SUCCEEDED, 1 FAILED or STOPPED).",
    )
    submit.add_argument(
        "--address",
        metavar="URL",
        help="job server, e.g. http://127.0.0.1:8265 (default: $RAY_ADDRESS)",
    )
    submit.add_argument(
        "--no-wait",
        action="store_true",
        help="print the job id and return without following the job",
    )
    submit.add_argument(
        "--num-gpus",
        type=float,
        default=None,
        help="GPUs Ray reserves for the job's driver (its learner's towers)",
    )
    submit.add_argument(
        "--num-cpus", type=float, default=None, help="CPUs Ray reserves for the job's driver"
    )
    submit.add_argument(
        "--working-dir", metavar="DIR", help="upload DIR as the job's working directory"
    )
    submit.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain http:// to a host other than this machine (the "
        "cluster token is then sent unencrypted)",
    )
    submit.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    submit.set_defaults(handler=_submit)
    _add_serve_parser(sub)
    _add_tune_parser(sub)
    _add_import_rllib_parser(sub)
    from policy_service.cli import estimate_command  # no TensorFlow until it runs

    estimate_command.add_parser(sub)
    sub.choices["estimate"].set_defaults(handler=_estimate)
    return parser


def main(argv: list[str] | None = None) -> int:
    if not os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip():  # unset or empty: quiet
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    args = build_parser().parse_args(argv)
    from policy_service.distributed.ray_runtime import announce_token_auth

    announce_token_auth(getattr(args, "address", None))
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UserError, RunFailure) as err:  # any other error keeps its traceback
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(err, UserError) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
