"""`heed launch`: the `heed train` recipe as a Ray job on a Ray cluster; `heed status` and `heed stop` for it.

    heed launch --config configs/qwen3-8b-da-multinode.yaml --address http://HEAD:8265
    heed launch --config configs/tiny.yaml cluster.trainer_workers=2     # no --address: a local Ray
    heed launch --resume RUN_DIR --address http://HEAD:8265              # continue from its last checkpoint
    heed status [JOB_ID] --address http://HEAD:8265
    heed stop JOB_ID --address http://HEAD:8265

Three places run code:

1. **The client** (`submit`, here). It loads and checks the config as `heed train` does, makes the run's
   relative paths absolute (the job runs elsewhere: ``run.output_dir`` must be storage every node of the
   cluster reaches), drops secrets, and submits a Ray job (``JobSubmissionClient``) whose working
   directory is this source tree, packaged by Ray. It then streams the job's logs until it ends
   (``--no-wait`` returns at once). Without ``--address`` it first starts a local Ray head whose
   dashboard and job server bind to ``cluster.dashboard_host`` (loopback by default) and stops it
   afterwards.
2. **The driver** (the job's entrypoint, ``python -m rl.launch``, on the head node). It starts the trainer
   ranks as a Ray Train ``TorchTrainer`` worker group: ``cluster.trainer_workers`` workers of
   ``cluster.trainer_resources`` each, placed by ``cluster.trainer_placement``, with torch.distributed
   set up by Ray Train (NCCL when the ranks have GPUs, gloo without).
3. **The trainer ranks** run the recipe (rl/train.py) data-parallel. Rank 0 starts the rollout pool: its
   actors hold one bundle each of the pool's own placement group (``rollout.num_cpus_per_actor`` /
   ``num_gpus_per_actor`` plus ``rollout.resources_per_actor``, e.g. a resource only the rollout nodes
   carry, placed by ``rollout.placement``), so a node whose GPUs the trainer ranks hold gets none;
   ``cluster.rollout_node_resource`` makes rank 0 check that every actor landed on a node carrying it.
   Under ``grpo.deepspeed`` accelerate builds the DeepSpeed engine in each rank on the process group Ray
   Train formed (Ray Train sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
   ``MASTER_ADDR``/``PORT`` to match it), exactly as under torchrun. With ``cluster.colocate`` the actors
   share the ranks' GPUs (fractions that fit one rank and one engine per GPU) and sleep while the ranks
   train (:class:`rollouts.pool.ColocatedPool`).

Failures. A lost rollout actor is replaced and its requests resubmitted by the pool. A lost trainer rank
ends the job (Ray Train's ``max_failures`` is 0): the driver says so and exits non-zero, the run
directory keeps its newest complete checkpoint, and ``heed launch --resume RUN_DIR`` continues from it.
``heed stop`` stops the job the same way (Ray ends the entrypoint, and with it the workers and actors).

Security. Ray's token authentication stays as Ray sets it up (on for a cluster that has a token; the
local head is started with ``RAY_AUTH_MODE=token`` and a token is generated when none exists); the
client sends the token from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``.
No secret leaves this machine: the job's command line carries the config without ``SECRET_FIELDS``, its
runtime environment holds no variable of this machine, and a config file that holds a secret is left out
of the package. Give the cluster's nodes their own ``WANDB_API_KEY`` (or ``wandb login`` there).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

JOB_PREFIX = "heed-"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Kept out of the job's package besides what .gitignore lists (Ray honours it too).
DEFAULT_EXCLUDES = [
    ".git", ".venv", "runs", "wandb", "**/__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
    "*.egg-info", "docs", ".env", "*.env",
]  # fmt: skip
JOB_ENV = {"PYTHONUNBUFFERED": "1"}  # the whole of the job's environment that comes from here


class LaunchError(RuntimeError):
    """A launch that cannot go ahead; the message says what to change."""


# -- what travels with the job ---------------------------------------------------------------------------


def source_tree() -> Path:
    """The folder packaged as the job's working directory: this checkout."""
    from rl.config.sections import REPO_ROOT

    if not (REPO_ROOT / "rl" / "launch.py").is_file() or not (REPO_ROOT / "pyproject.toml").is_file():
        raise LaunchError(
            f"heed launch packages the source tree, and {REPO_ROOT} is not one: run from a checkout"
        )
    return REPO_ROOT


def job_config(raw: dict, cwd: Path) -> dict:
    """The config the job receives: secrets dropped (``raw`` is ``RunConfig.to_dict(redact=True)``) and
    relative paths of this machine made absolute (the job's working directory is a copy elsewhere).
    Model and tokenizer paths change only when they name a local folder (else they are hub ids)."""
    raw = copy.deepcopy(raw)

    def absolute(section: str, key: str, *, local_only: bool = False) -> None:
        value = (raw.get(section) or {}).get(key)
        if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
            return
        candidate = cwd / Path(value).expanduser()
        if local_only and not candidate.exists():
            return
        raw[section][key] = str(candidate.resolve())
        build = (raw.get("data") or {}).get("build")
        if section == "tokenizer" and isinstance(build, dict) and build.get("tokenizer") == value:
            build["tokenizer"] = raw[section][key]  # the data is built with the tokenizer it trains with

    for section, key in (("run", "output_dir"), ("data", "path"), ("export", "out")):
        absolute(section, key)
    absolute("model", "path", local_only=True)
    absolute("tokenizer", "path", local_only=True)
    return raw


def holds_secret(config_file: Path) -> bool:
    """Whether a config file sets any of ``SECRET_FIELDS``."""
    from rl.config import SECRET_FIELDS

    raw = yaml.safe_load(Path(config_file).read_text()) or {}
    for dotted in SECRET_FIELDS:
        section, name = dotted.split(".")
        if (
            isinstance(raw, dict)
            and isinstance(raw.get(section), dict)
            and raw[section].get(name) is not None
        ):
            return True
    return False


def job_runtime_env(config, config_file: Path | None, working_dir: Path) -> dict:
    """The job's Ray runtime environment: the packaged source tree (secret-bearing config files and the
    usual bulk left out) and ``JOB_ENV``, nothing else of this machine's environment."""
    excludes = [*DEFAULT_EXCLUDES, *config.cluster.working_dir_excludes]
    if config_file is not None and holds_secret(config_file):
        with contextlib.suppress(ValueError):  # a file outside the tree is not packaged anyway
            excludes.append(Path(config_file).resolve().relative_to(working_dir.resolve()).as_posix())
    return {"working_dir": str(working_dir), "excludes": excludes, "env_vars": dict(JOB_ENV)}


def encode_config(raw: dict) -> str:
    return base64.urlsafe_b64encode(yaml.safe_dump(raw, sort_keys=False).encode()).decode()


def decode_config(text: str) -> dict:
    return yaml.safe_load(base64.urlsafe_b64decode(text.encode()).decode())


def entrypoint(raw: dict, *, resume: bool, python: str) -> str:
    command = [python, "-m", "rl.launch", "--config-b64", encode_config(raw)]
    return shlex.join([*command, "--resume"] if resume else command)


# -- the client ------------------------------------------------------------------------------------------


def use_token_auth() -> None:
    """Send Ray's token when there is one (Ray's own clients do the same); set before Ray is imported."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    if (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or _default_token().is_file()
    ):
        os.environ["RAY_AUTH_MODE"] = "token"


def _default_token() -> Path:
    return Path.home() / ".ray" / "auth_token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> str:
    return str(Path(sys.executable).parent / "ray")


@contextlib.contextmanager
def local_ray(config, *, ready_timeout_s: float = 120.0) -> Iterator[str]:
    """A Ray head on this machine for one job (its own temp dir and process group, stopped on exit);
    yields its job server's address. Token authentication is on unless ``RAY_AUTH_MODE`` says otherwise.
    Its logical CPUs are the machine's, or what the job asks for if that is more (the ranks and engines
    then share the cores), so a two-rank job runs on a laptop."""
    cluster = config.cluster
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "token")
    if env["RAY_AUTH_MODE"] == "token" and not (
        env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH") or _default_token().is_file()
    ):
        subprocess.run([_ray_cli(), "get-auth-token", "--generate"], check=True, capture_output=True, env=env)
    os.environ["RAY_AUTH_MODE"] = env["RAY_AUTH_MODE"]  # this process talks to it with the token too
    temp_dir = tempfile.mkdtemp(prefix="heedray", dir="/tmp")  # short: Ray's socket paths have a limit
    log_path = Path(temp_dir) / "head.log"
    command = [
        _ray_cli(), "start", "--head", f"--port={_free_port()}", f"--ray-client-server-port={_free_port()}",
        f"--num-cpus={max(os.cpu_count() or 1, math.ceil(job_resources(config).get('CPU', 0)))}",
        "--include-dashboard=true", f"--dashboard-host={cluster.dashboard_host}",
        f"--dashboard-port={cluster.dashboard_port}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
        "--block",
    ]  # fmt: skip
    host = "127.0.0.1" if cluster.dashboard_host in ("0.0.0.0", "::") else cluster.dashboard_host
    address = f"http://{host}:{cluster.dashboard_port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        _wait_for_job_server(address, proc, log_path, ready_timeout_s)
        yield address
    finally:
        stop_process_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_job_server(address: str, proc, log_path: Path, timeout_s: float) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise LaunchError(
                f"the local Ray head exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}"
            )
        try:
            JobSubmissionClient(address)
            return
        except Exception as err:  # not listening yet
            if time.monotonic() > deadline:
                message = f"the local Ray job server at {address} did not answer in {timeout_s:g}s: {err}"
                raise LaunchError(message) from err
            time.sleep(1.0)


def stop_process_group(proc, timeout_s: float = 30.0) -> None:
    """SIGTERM to the process group ``proc`` leads (``start_new_session=True``), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def job_server(address: str) -> str:
    """``--address`` as the job server's URL: ``http(s)://host:port`` (the dashboard, 8265 by default),
    ``host:port`` (taken as that) or ``auto`` (the Ray cluster this machine is part of)."""
    if address.startswith("ray://"):
        raise LaunchError(
            f"{address} is a Ray Client address; Ray jobs go through the head's job server: "
            "--address http://HEAD:8265 (the dashboard port)"
        )
    if address == "auto":
        from ray.dashboard.utils import get_address_for_submission_client

        return get_address_for_submission_client("auto")
    return address if "://" in address else f"http://{address}"


def submit(
    config,
    *,
    address: str | None,
    config_file: Path | None = None,
    resume: bool = False,
    wait: bool = True,
) -> int:
    """Submit the job (see the module docstring); returns the exit status ``heed launch`` ends with."""
    use_token_auth()
    raw = job_config(config.to_dict(redact=True), Path.cwd())
    run_dir = raw["run"]["output_dir"]
    if config.logging.wandb_api_key:
        print(
            "heed: logging.wandb_api_key stays on this machine: give the cluster's nodes WANDB_API_KEY "
            "(or run `wandb login` there) for online logging",
            file=sys.stderr,
        )
    runtime_env = job_runtime_env(config, config_file, source_tree())
    if address is None:
        if not wait:
            raise LaunchError("--no-wait needs --address: the local Ray stops when `heed launch` ends")
        with local_ray(config) as server:
            print(f"heed: local Ray started, job server {server}")
            command = entrypoint(raw, resume=resume, python=sys.executable)
            return _submit_and_follow(server, command, runtime_env, config, run_dir, wait, local=True)
    command = entrypoint(raw, resume=resume, python=config.cluster.python)
    return _submit_and_follow(job_server(address), command, runtime_env, config, run_dir, wait, local=False)


def _submit_and_follow(server, command, runtime_env, config, run_dir, wait, *, local) -> int:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(server)
    job_id = client.submit_job(
        entrypoint=command,
        runtime_env=runtime_env,
        submission_id=f"{JOB_PREFIX}{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
        metadata={"heed_run_dir": run_dir, "heed_run_name": config.run.name},
    )
    print(f"heed: submitted job {job_id} to {server} (run directory {run_dir})", flush=True)
    if not wait:
        print(f"heed: follow it with `heed status {job_id} --address {server}`")
        return 0
    try:
        return follow(client, job_id)
    except KeyboardInterrupt:
        if local:
            client.stop_job(job_id)
            print(f"heed: stopped {job_id}", file=sys.stderr)
        else:
            print(
                f"heed: job {job_id} keeps running: `heed stop {job_id} --address {server}`", file=sys.stderr
            )
        return 130


def follow(client, job_id: str) -> int:
    """Stream the job's logs to stdout until it ends; its exit status (SUCCEEDED 0, STOPPED 143)."""
    import asyncio

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            sys.stdout.write(lines)
            sys.stdout.flush()

    asyncio.run(tail())
    info = wait_until_done(client, job_id)  # the stream can close before Ray records the end
    status = str(info.status)
    print(f"heed: job {job_id} {status}" + (f": {info.message}" if info.message else ""), flush=True)
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 143
    return info.driver_exit_code or 1


def wait_until_done(client, job_id: str, timeout_s: float | None = None):
    """The job's info once it has ended (or when ``timeout_s`` runs out)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        info = client.get_job_info(job_id)
        if str(info.status) in TERMINAL or (deadline is not None and time.monotonic() > deadline):
            return info
        time.sleep(1.0)


def status(address: str, job_id: str | None = None, *, logs: bool = False) -> int:
    """One job's state (and its logs), or every Heed job the cluster knows."""
    from ray.job_submission import JobSubmissionClient

    use_token_auth()
    client = JobSubmissionClient(job_server(address))
    jobs = [client.get_job_info(job_id)] if job_id else client.list_jobs()
    jobs = [j for j in jobs if job_id or (j.submission_id or "").startswith(JOB_PREFIX)]
    for info in sorted(jobs, key=lambda j: j.start_time or 0):
        run_dir = (info.metadata or {}).get("heed_run_dir", "-")
        message = f"  {info.message.strip().splitlines()[-1]}" if info.message else ""
        print(f"{info.submission_id}  {info.status}  {run_dir}{message}")
    if job_id and logs:
        print(client.get_job_logs(job_id), end="")
    if not jobs:
        print("no heed jobs on this cluster")
    return 0


def stop(address: str, job_id: str, timeout_s: float = 60.0) -> int:
    """Stop a job; returns once Ray reports it ended."""
    from ray.job_submission import JobSubmissionClient

    use_token_auth()
    client = JobSubmissionClient(job_server(address))
    client.stop_job(job_id)
    info = wait_until_done(client, job_id, timeout_s)
    run_dir = (info.metadata or {}).get("heed_run_dir", "RUN_DIR")
    print(f"{job_id}  {info.status}  (continue it with `heed launch --resume {run_dir}`)")
    return 0 if str(info.status) in TERMINAL else 1


# -- the driver and the trainer ranks (on the cluster) -----------------------------------------------------


def train_worker(loop_config: dict) -> None:
    """One trainer rank (a Ray Train worker): the recipe, with the distributed env Ray Train set up."""
    from rl.config import parse_run_config
    from rl.train import TrainRecipe

    TrainRecipe(parse_run_config(loop_config["config"]), resume=loop_config["resume"]).run()


def job_resources(config) -> dict[str, float]:
    """Ray resources the job holds at once: every trainer rank and every rollout actor."""
    cluster, rollout = config.cluster, config.rollout
    need: dict[str, float] = {}
    for name, amount in cluster.trainer_resources.items():
        need[name] = need.get(name, 0.0) + amount * cluster.trainer_workers
    need["CPU"] = need.get("CPU", 0.0) + rollout.num_cpus_per_actor * rollout.num_actors
    need["GPU"] = need.get("GPU", 0.0) + rollout.num_gpus_per_actor * rollout.num_actors
    for name, amount in rollout.resources_per_actor.items():
        need[name] = need.get(name, 0.0) + amount * rollout.num_actors
    return {k: v for k, v in need.items() if v > 0}


def check_capacity(config, available: dict[str, float]) -> None:
    """Fail before anything starts when the cluster cannot hold the job at all (Ray would otherwise
    wait for resources forever); ``available`` is ``ray.cluster_resources()``."""
    short = {
        k: (v, available.get(k, 0.0)) for k, v in job_resources(config).items() if available.get(k, 0.0) < v
    }
    if short:
        lines = ", ".join(
            f"{k}: needs {need:g}, the cluster has {have:g}" for k, (need, have) in short.items()
        )
        raise LaunchError(
            f"the cluster cannot hold this job ({lines}): cluster.trainer_workers x cluster.trainer_resources "
            "plus rollout.num_actors x rollout.num_cpus_per_actor / num_gpus_per_actor / resources_per_actor"
        )


def driver_main(argv: list[str] | None = None) -> int:
    """The job's entrypoint: the trainer ranks as a Ray Train worker group, until they finish or fail."""
    parser = argparse.ArgumentParser(prog="python -m rl.launch", description=driver_main.__doc__)
    parser.add_argument("--config-b64", required=True, help="the run config (YAML, base64; no secrets)")
    parser.add_argument("--resume", action="store_true", help="continue the run in run.output_dir")
    args = parser.parse_args(argv)

    import ray
    from ray.train import FailureConfig, ScalingConfig, TrainingFailedError
    from ray.train import RunConfig as TrainRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from rl.config import parse_run_config

    raw = decode_config(args.config_b64)
    config = parse_run_config(raw)
    cluster, run_dir = config.cluster, Path(config.run.output_dir)
    ray.init()  # the cluster this job runs on
    try:
        check_capacity(config, ray.cluster_resources())
    except LaunchError as err:
        print(f"heed: error: {err}", file=sys.stderr, flush=True)
        return 2
    resources = dict(cluster.trainer_resources)
    gpus = resources.get("GPU", 0)
    backend = cluster.backend or ("nccl" if gpus > 0 else "gloo")
    print(
        f"heed: {cluster.trainer_workers} trainer rank(s) of {resources} ({cluster.trainer_placement}, "
        f"{backend}); {config.rollout.num_actors} rollout actor(s) of {config.rollout.num_cpus_per_actor:g} "
        f"CPU / {config.rollout.num_gpus_per_actor:g} GPU; run directory {run_dir}",
        flush=True,
    )
    if config.grpo.deepspeed:  # accelerate builds the engine in each rank, on Ray Train's process group
        print(f"heed: DeepSpeed config {config.grpo.deepspeed} (SFT and GRPO)", flush=True)
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"config": raw, "resume": args.resume},
        scaling_config=ScalingConfig(
            num_workers=cluster.trainer_workers,
            use_gpu=gpus > 0,
            resources_per_worker=resources,
            placement_strategy=cluster.trainer_placement,
        ),
        torch_config=TorchConfig(backend=backend),
        run_config=TrainRunConfig(
            name=f"{JOB_PREFIX}{config.run.name}",
            storage_path=str(run_dir / "ray_train"),
            failure_config=FailureConfig(max_failures=0),  # a lost rank ends the job; resume continues it
        ),
    )
    try:
        trainer.fit()
    except TrainingFailedError as err:
        print(
            f"heed: the trainer ranks failed: {err}\nheed: {run_dir} keeps its newest complete checkpoint; "
            f"continue with `heed launch --resume {run_dir}`",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(f"heed: run finished: {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(driver_main())
