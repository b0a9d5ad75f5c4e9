"""`warmstart local` (serve the local Lambda), `warmstart invoke` (one event through boto3)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from infra.local.config import CGROUP_WANTS, DEFAULT_MEMORY_MB, INIT_TYPES, INVOKE_MODES, JITTERS, LocalLambdaConfig

DEFAULT_ENDPOINT = "http://127.0.0.1:9000"
# What `invoke` sends when given no event: the default model's (an embedding model) example request.
DEFAULT_EVENT = {"inputs": "hello"}
SUMMARY_NUMBERS = 4  # a list of numbers longer than this prints as its first few and its length (--full: all)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = sub.add_parser("local", help="run the local Lambda (Runtime API + Invoke API, many instances)")
    add_function_options(local)
    local.add_argument("--host", default="127.0.0.1", help="listen address (default: %(default)s)")
    local.add_argument("--port", type=int, default=9000, help="Invoke API port, 0 = any free (default: %(default)s)")
    local.add_argument("--quiet", action="store_true", help="do not echo instance output")
    local.set_defaults(func=run_local)

    invoke = sub.add_parser("invoke", help="send one event to a running local Lambda and show the REPORT line")
    invoke.add_argument(
        "payload", nargs="?", help=f"JSON event, @file, or - for stdin (default: {json.dumps(DEFAULT_EVENT)})"
    )
    invoke.add_argument("--payload-file", help="read the event from this file")
    invoke.add_argument("--endpoint-url", default=os.environ.get("WARMSTART_ENDPOINT", DEFAULT_ENDPOINT))
    invoke.add_argument("--function", default="warmstart", help="function name or ARN (default: %(default)s)")
    invoke.add_argument("--qualifier", help="version or alias")
    invoke.add_argument("--invocation-type", choices=("RequestResponse", "Event", "DryRun"), default="RequestResponse")
    invoke.add_argument("--logs", action="store_true", help="print the whole log tail, not just REPORT")
    shown = invoke.add_mutually_exclusive_group()
    shown.add_argument("--full", action="store_true", help="print the whole answer (default: long vectors cut)")
    shown.add_argument("--json", action="store_true", help="print the answer as it came, one JSON line")
    invoke.set_defaults(func=run_invoke)


def add_function_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--function-name", default="warmstart", help="(default: %(default)s)")
    p.add_argument("--handler", default="handler.app.lambda_handler", help="(default: %(default)s)")
    p.add_argument(
        "--command",
        help="what each instance runs instead of `python -m awslambdaric HANDLER`, e.g. 'python -m handler'"
        " (a leading python is this interpreter)",
    )
    p.add_argument(
        "--invoke-mode",
        choices=INVOKE_MODES,
        default="BUFFERED",
        help="the Function URL's (/lambda-url/FUNCTION/...): RESPONSE_STREAM streams (default: %(default)s)",
    )
    p.add_argument("--max-concurrency", type=int, default=10, help="instances at most (default: %(default)s)")
    p.add_argument("--keep-alive", type=float, default=300.0, help="idle seconds before reaping (default: 300)")
    p.add_argument("--timeout", type=float, default=30.0, help="function timeout, seconds (default: 30)")
    p.add_argument("--init-timeout", type=float, default=10.0, help="init phase limit, seconds (default: 10)")
    p.add_argument(
        "--memory",
        type=int,
        default=DEFAULT_MEMORY_MB,
        help="memory size, MB: each instance gets memory/1769 vCPU and this memory limit through cgroups"
        " (default: %(default)s, template.yaml's MemorySize)",
    )
    p.add_argument("--cgroups", choices=CGROUP_WANTS, default="auto", help="v2 where delegated, else v1 (default)")
    p.add_argument("--init-slots", type=int, default=0, help="inits at once; 0 = what the host's cores fit")
    p.add_argument("--no-runtime-api-guard", action="store_true", help="let any local process use a Runtime API")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="routing delay before each invoke (default: 0)")
    p.add_argument("--jitter", choices=JITTERS, default="uniform", help="its distribution (default: uniform)")
    p.add_argument("--max-retry-attempts", type=int, default=2, help="Event invoke retries, 0-2 (default: 2)")
    p.add_argument("--async-retry-scale", type=float, default=1.0, help="x Lambda's 60 s / 120 s retry delays")
    p.add_argument("--max-event-age", type=float, default=21600.0, help="seconds an event may wait (default: 6 h)")
    p.add_argument("--on-failure", help="file: one JSON destination record a line per dropped Event invoke")
    p.add_argument("--max-queued-events", type=int, default=10_000, help="Event queue bound (default: 10000)")
    p.add_argument("--init-type", choices=INIT_TYPES, default="on-demand")
    p.add_argument(
        "--snapshot",
        action="store_true",
        help="SnapStart locally: one template runs init + before-snapshot hooks, instances are forked from it"
        " and restored (implies --init-type snap-start)",
    )
    p.add_argument("--model", help="packed model directory (sets WARMSTART_MODEL)")
    p.add_argument("--backend", type=backend_name, help="sets WARMSTART_BACKEND (a built-in or an installed plugin's)")


def backend_name(value: str) -> str:
    """A backend the registry knows (built in, or an installed package's entry point); else the registry's
    error, which lists the valid names."""
    from handler.backends import registry
    from handler.core.errors import ConfigError

    try:
        return registry.spec(value).name
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def config_from_args(args: argparse.Namespace, **overrides: Any) -> LocalLambdaConfig:
    environment = {}
    if args.model:
        environment["WARMSTART_MODEL"] = os.path.abspath(args.model)
    if args.backend:
        environment["WARMSTART_BACKEND"] = args.backend
    settings: dict[str, Any] = dict(
        function_name=args.function_name,
        handler=args.handler,
        command=tuple(shlex.split(args.command)) if args.command else (),
        invoke_mode=args.invoke_mode,
        max_concurrency=args.max_concurrency,
        keep_alive_s=args.keep_alive,
        timeout_s=args.timeout,
        init_timeout_s=args.init_timeout,
        memory_mb=args.memory,
        cgroups=args.cgroups,
        init_slots=args.init_slots,
        runtime_api_guard=not args.no_runtime_api_guard,
        jitter_ms=args.jitter_ms,
        jitter=args.jitter,
        max_retry_attempts=args.max_retry_attempts,
        async_retry_scale=args.async_retry_scale,
        max_event_age_s=args.max_event_age,
        on_failure=args.on_failure,
        max_queued_events=args.max_queued_events,
        init_type="snap-start" if args.snapshot else args.init_type,
        snapshot=args.snapshot,
        environment=environment,
    )
    settings.update(overrides)
    return LocalLambdaConfig(**settings)


def model_dir(args: argparse.Namespace) -> Path | None:
    """The packed model directory the instances will serve: --model, WARMSTART_MODEL, else the handler's
    default; None when it is a remote source (s3://...) read only by the instance."""
    from handler.core.config import DEFAULT_MODEL_DIRS

    chosen = args.model or os.environ.get("WARMSTART_MODEL", "").strip()
    if "://" in chosen:
        return None
    if chosen:
        return Path(chosen)
    return next((p for p in DEFAULT_MODEL_DIRS if p.is_dir()), DEFAULT_MODEL_DIRS[0])


def unpacked(path: Path) -> str | None:
    """Why `path` cannot be served (with the command that fixes it), or None when it is a packed model."""
    if (path / "manifest.json").is_file():
        return None
    if not path.exists():
        return f"{path} does not exist; pack a model first: `warmstart pack --default` (or --from DIR)"
    out = f"models/{path.resolve().name}"
    return (
        f"{path} is not a packed model (no manifest.json); pack it first: `warmstart pack --from {path} "
        f"--out {out}`, then `warmstart local --model {out}`"
    )


def served(path: Path | None) -> tuple[str, dict[str, Any] | None]:
    """The served model as the banner names it (`id@version (task)`), and its task's example request."""
    if path is None:
        return "the model at WARMSTART_MODEL", None
    try:
        with open(path / "manifest.json", encoding="utf-8") as f:
            manifest = json.load(f)
        key, task = f"{manifest['id']}@{manifest['version']}", str(manifest.get("task", "embedding"))
    except (OSError, ValueError, KeyError, TypeError):
        return f"the model at {path}", None
    from handler.core.errors import ConfigError
    from handler.tasks import catalog  # deferred: the task modules, only to name the example request

    try:
        example = catalog.spec(task).example
    except ConfigError:  # a plugin's task this environment does not have
        example = None
    return f"{key} ({task}) from {path}", example


def run_local(args: argparse.Namespace) -> int:
    from infra.local.destination import DestinationError
    from infra.local.server import LocalLambda

    path = model_dir(args)
    wrong = unpacked(path) if args.model and path is not None else None
    if wrong:  # refused now, not at the first invoke's init
        print(f"warmstart local: --model {wrong}", file=sys.stderr)
        return 2
    model, example = served(path)
    config = config_from_args(args, host=args.host, port=args.port, echo_logs=not args.quiet)
    local = LocalLambda(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        endpoint = local.start()
    except DestinationError as exc:
        print(f"warmstart local: --on-failure {exc}", file=sys.stderr)
        return 1
    name = config.function_name
    print(f"warmstart local: function {name!r} ({config.handler}) at {endpoint}", flush=True)
    print(f"  model:  {model}")
    event = shlex.quote(json.dumps(example)) if example is not None else "'{\"inputs\": {NAME: [...]}}'"
    print(
        f"  try:    warmstart invoke {event}" + (" --endpoint-url " + endpoint if endpoint != DEFAULT_ENDPOINT else "")
    )
    print(f"  boto3:  boto3.client('lambda', endpoint_url='{endpoint}').invoke(FunctionName='{name}', ...)")
    print(f"  curl:   curl -d {event} {endpoint}/2015-03-31/functions/function/invocations")
    print(f"  URL:    {endpoint}/lambda-url/{name}/ (invoke mode {config.invoke_mode})")
    print(f"  max concurrency {config.max_concurrency}, keep-alive {config.keep_alive_s:g} s; Ctrl-C stops", flush=True)
    print(f"  {local.pool.cgroups.describe(config.memory_mb)}", flush=True)
    slots = local.pool.slots.slots
    print(f"  init slots {slots} (inits wait for one before their clock starts; one that sleeps lends it)", flush=True)
    if config.snapshot:
        print("  snapshot: instances are forked from a template made on the first invoke of each version", flush=True)
    stop.wait()
    print("warmstart local: stopping", file=sys.stderr, flush=True)
    local.stop()
    return 0


def read_payload(args: argparse.Namespace) -> bytes:
    if args.payload_file:
        with open(args.payload_file, "rb") as f:
            return f.read()
    if args.payload == "-":
        return sys.stdin.buffer.read()
    if args.payload and args.payload.startswith("@"):
        with open(args.payload[1:], "rb") as f:
            return f.read()
    return args.payload.encode() if args.payload else json.dumps(DEFAULT_EVENT).encode()


def lambda_client(endpoint_url: str, *, read_timeout: float = 905.0) -> Any:
    import boto3  # type: ignore[import-untyped]  # deferred: a 300 ms import nobody else needs
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client(
        "lambda",
        endpoint_url=endpoint_url,
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "local"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "local"),
        config=Config(retries={"total_max_attempts": 1}, read_timeout=read_timeout, connect_timeout=5),
    )


def shorten(value: Any) -> Any:
    """The answer with every long list of numbers cut to its first few and its length (one embedding is 384
    numbers: a screenful each)."""
    if isinstance(value, dict):
        return {k: shorten(v) for k, v in value.items()}
    if isinstance(value, list):
        numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        if numbers and len(value) > SUMMARY_NUMBERS:
            head = ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in value[:SUMMARY_NUMBERS])
            return f"[{head}, ...] ({len(value)} numbers; --full for all)"
        return [shorten(x) for x in value]
    return value


def show(body: bytes, args: argparse.Namespace) -> None:
    try:
        answer = json.loads(body)
    except ValueError:
        sys.stdout.buffer.write(body + b"\n")
        return
    if args.json:
        print(json.dumps(answer, separators=(",", ":")))
    else:
        print(json.dumps(answer if args.full else shorten(answer), indent=2))


def run_invoke(args: argparse.Namespace) -> int:
    from botocore.exceptions import EndpointConnectionError  # type: ignore[import-untyped]

    payload = read_payload(args)
    client = lambda_client(args.endpoint_url)
    try:
        return invoke_once(client, payload, args)
    except EndpointConnectionError:
        print(
            f"warmstart invoke: nothing answers at {args.endpoint_url}; start the local Lambda first: "
            "`warmstart local` (in another terminal), or pass --endpoint-url",
            file=sys.stderr,
        )
        return 2
    finally:
        client.close()


def invoke_once(client: Any, payload: bytes, args: argparse.Namespace) -> int:
    kwargs: dict[str, Any] = dict(FunctionName=args.function, Payload=payload, InvocationType=args.invocation_type)
    if args.qualifier:
        kwargs["Qualifier"] = args.qualifier
    if args.invocation_type == "RequestResponse":
        kwargs["LogType"] = "Tail"
    try:
        result = client.invoke(**kwargs)
    except client.exceptions.ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    body = result["Payload"].read()
    if body:
        show(body, args)
    log = base64.b64decode(result.get("LogResult", "")).decode("utf-8", "replace")
    if args.logs:
        sys.stderr.write(log)
    else:
        for line in log.splitlines():
            if line.startswith("REPORT "):
                print(line.replace("\t", "  ").strip(), file=sys.stderr)
    status = f"status {result['StatusCode']}, version {result.get('ExecutedVersion', '-')}"
    if result.get("FunctionError"):
        print(f"{status}, function error: {result['FunctionError']}", file=sys.stderr)
        return 1
    print(status, file=sys.stderr)
    return 0
