"""``edgeagent serve``: run the node agent until SIGTERM.

With neither ``--config`` nor ``--repository`` it serves the embedded demo: a repository
of real ONNX models generated (once) under the data directory, with a budget smaller
than the zoo so that eviction happens. Flags override the config file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from agent.commands import declared_option, self_command
from agent.config import AgentConfig, ConfigError, load_agent_config
from agent.units import format_size, parse_size

# asyncio, YAML and the node (aiohttp, onnxruntime) are imported by the code that
# runs: ``edgeagent serve --help`` pays for the config's declaration (its flags' help)
# and none of them.

log = logging.getLogger("edgeagent.serve")


def _write_demo(repository: Path) -> None:
    """Generate the demo repository in a child process: the weights it computes (over a
    hundred MB) then never enter the agent's own memory."""
    import subprocess

    code = ("import sys; from agent.modelzoo import write_demo_repository; "
            "write_demo_repository(sys.argv[1])")
    done = subprocess.run([sys.executable, "-c", code, str(repository)])
    if done.returncode != 0:
        raise click.ClickException(f"could not generate the demo repository in {repository}")
    (repository / ".complete").touch()


def build_config(config_file: str | None, overrides: dict[str, Any]) -> tuple[AgentConfig, bool]:
    """(config, is_demo): the file (or defaults) with flags applied; demo when no
    repository is configured anywhere."""
    config = load_agent_config(config_file) if config_file else AgentConfig()
    config = config.with_overrides(**overrides)
    demo = config.repository is None
    if demo:
        from agent.modelzoo import DEMO_BUDGET

        config = config.with_overrides(
            repository=config.data_dir / "demo-models",
            cpu_budget=config.cpu_budget or parse_size(DEMO_BUDGET))
    return config, demo


async def run_agent(config: AgentConfig, *, config_file: str | None = None,
                    overrides: dict[str, Any] | None = None, announce: bool = True) -> None:
    """Serve until SIGTERM/SIGINT; SIGHUP re-reads the config and rescans."""
    import asyncio
    import signal

    from agent.http.connections import server_connections
    from agent.http.eventloop import listen, settle_gc
    from agent.node.app import NODE, create_app
    from agent.node.sdnotify import notify, watchdog_interval
    from agent.security.tls import ServerTls

    tls = ServerTls(config.tls) if config.tls is not None else None
    app = create_app(config)
    node = app[NODE]
    runner, url = await listen(app, config.host, config.port, server_connections(config),
                               shutdown_timeout=config.drain_seconds,
                               ssl_context=tls.context if tls else None)
    grpc_server = None
    if config.grpc_port:  # KServe v2 gRPC on the same event loop, over the same node
        from agent.node.grpc_v2 import start_grpc

        try:
            grpc_server = await start_grpc(node, config.host, config.grpc_port, tls)
        except OSError:
            await runner.cleanup()
            raise
    node.router.listening(url, grpc_server.address if grpc_server else None)
    settle_gc()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def reload() -> None:
        notify("RELOADING=1")
        try:
            if config_file:
                new, _ = build_config(config_file, overrides or {})
                node.reload(new)
                if new.tls != config.tls:
                    log.warning("SIGHUP: the tls section changed; the files at the paths "
                                "the agent started with are read again: restart to use "
                                "the new ones")
            else:
                node.rescan()
            if tls is not None:  # the same files again: new handshakes get them
                tls.reload()
            log.info("SIGHUP: configuration reloaded")
        except (ConfigError, OSError, ValueError) as exc:
            log.error("SIGHUP: keeping the running configuration: %s", exc)
        notify("READY=1")

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload)

    budgets = ", ".join(f"{d} {format_size(p.budget)}" for d, p in node.cache.pools.items())
    log.info("serving %d model(s) from %s on %s%s (budget: %s; policy %s)",
             len(node.cache.specs), config.repository, url,
             f" and gRPC {grpc_server.address}" if grpc_server else "", budgets, config.policy)
    if announce:
        first = next(iter(sorted(node.cache.specs)), "MODEL")
        click.echo(f"edgeagent listening on {url}  (models: {config.repository}, "
                   f"budget: {budgets}, policy: {config.policy})")
        if grpc_server is not None:
            click.echo(f"  gRPC (KServe v2, tritonclient.grpc): {grpc_server.address}")
        click.echo(f"  curl -s {url}/v1/cache")
        click.echo(f"  curl -s {url}/v1/models/{first}")
        click.echo(f"  {self_command()} cache ls --url {url}")
        sys.stdout.flush()
    notify(f"READY=1\nSTATUS=serving on {url}\nMAINPID={__import__('os').getpid()}")

    async def watchdog(interval: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    interval = watchdog_interval()
    dog = loop.create_task(watchdog(interval)) if interval else None
    try:
        await stop.wait()
    finally:
        notify("STOPPING=1")
        log.info("stopping: no new connections, draining %d request(s) in flight",
                 sum(e.account.in_flight for e in node.cache.entries.values()))
        if dog is not None:
            dog.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if grpc_server is not None:  # no new calls; those in flight finish first
            await grpc_server.stop(config.drain_seconds)
        await runner.cleanup()  # stops listening, waits for handlers, persists state
        log.info("stopped")


_PATH_IN = {"exists": True, "path_type": Path}


@click.command()
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="Agent config YAML (edgeagent config example agent shows every key).")
@declared_option(AgentConfig, "repository", type=click.Path(file_okay=False, **_PATH_IN))
@declared_option(AgentConfig, "host")
@declared_option(AgentConfig, "port")
@declared_option(AgentConfig, "grpc_port")
@declared_option(AgentConfig, "cpu_budget")
@declared_option(AgentConfig, "gpu_budget")
@declared_option(AgentConfig, "policy")
@declared_option(AgentConfig, "admin_token_file",
                 type=click.Path(dir_okay=False, **_PATH_IN))
@declared_option(AgentConfig, "data_dir", type=click.Path(file_okay=False, path_type=Path))
@declared_option(AgentConfig, "log_level")
@declared_option(AgentConfig, "insecure", is_flag=True, flag_value=True, default=None)
def serve(config_file: str | None, **flags: Any) -> None:
    """Run the node agent (OIP v2 REST and gRPC + TF Serving REST + cache admin +
    /metrics)."""
    # One policy decision per request needs no compiler: the kernels run interpreted,
    # and numba/llvmlite stay out of the agent's memory (cachepolicies.jit).
    os.environ.setdefault("EDGEAGENT_JIT", "0")
    from agent.http.eventloop import run_event_loop

    overrides = {k: (v.resolve() if isinstance(v, Path) else v) for k, v in flags.items()}
    if overrides.get("policy"):
        from cachepolicies.registry import parse_policy_spec

        try:
            parse_policy_spec(overrides["policy"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--policy") from None
    from agent.config.preflight import check_agent

    try:  # what config check refuses stops the start before the demo is generated
        config, demo = build_config(config_file, overrides)
        check_agent(config, config_file, demo=demo)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if demo and not (config.repository / ".complete").exists():
        click.echo(f"generating the demo model repository in {config.repository} ...")
        _write_demo(config.repository)
    from agent.node.app import prepare_process

    prepare_process()
    try:
        run_event_loop(run_agent(config, config_file=config_file, overrides=overrides))
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    with contextlib.suppress(Exception):
        logging.shutdown()
