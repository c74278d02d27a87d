"""The lazy CLI: ``edgeagent --help`` and ``edgeagent CMD --help`` import no heavy module,
and what the lazy group shows without importing a command is what the command says.

Timings are bench/cli_startup.py's business; here only what gets imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from agent.cli import COMMANDS, main

HEAVY = ("scipy", "pandas", "pyarrow", "numba", "numpy", "onnxruntime", "onnx", "aiohttp",
         "asyncio", "yaml", "sklearn", "tensorflow", "grpc", "matplotlib", "cachepolicies")


def _imported_after(*args: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after ``edgeagent ARGS``."""
    code = ("import sys, json\n"
            "from agent.cli import main\n"
            "try:\n"
            f"    main({list(args)!r})\n"
            "except SystemExit:\n"
            "    pass\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_top_level_help_imports_no_command():
    assert _imported_after("--help") == []
    code = ("import sys\nfrom agent.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('agent.commands.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("args", [
    *([name, "--help"] for name in COMMANDS),
    ["plan", "allocate", "--help"], ["workload", "generate", "--help"],
    ["coordinator", "models", "set", "--help"], ["cache", "ls", "--help"],
])
def test_command_help_imports_nothing_heavy(args):
    assert _imported_after(*args) == []


def test_lazy_help_is_the_commands_own():
    for name, (target, short_help) in COMMANDS.items():
        command = main.get_command(click.Context(main), name)
        assert command is not None and command.name in (name, target.rsplit(":")[1])
        assert short_help == command.get_short_help_str(10_000), name


def test_every_command_is_listed_and_runs_help():
    out = CliRunner().invoke(main, ["--help"]).output
    for name in COMMANDS:
        assert f"  {name} " in out
        assert CliRunner().invoke(main, [name, "--help"]).exit_code == 0


def test_spelled_out_choices_match_their_sources():
    from agent.commands import simulate, workload
    from cachepolicies import workloads
    from cachepolicies.registry import POLICY_NAMES

    assert simulate.POLICY_NAMES == POLICY_NAMES
    assert (workload.ASSOCIATIONS, workload.NAMINGS) == (workloads.ASSOCIATIONS,
                                                         workloads.NAMINGS)


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["nosuch"])
    assert result.exit_code == 2 and "No such command" in result.output


@pytest.mark.parametrize("columns", ["64", "200", "abc", None])
def test_top_level_help_takes_clicks_width_without_shutil(columns):
    """``edgeagent --help`` measures the terminal itself (click would import shutil, and
    with it bz2 and lzma): the same width as click's own formatter, shutil unloaded."""
    import os

    code = ("import sys, io, contextlib\n"
            "from agent.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            "        main(['--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "loaded = 'shutil' in sys.modules\n"
            "import click.formatting\n"
            "from agent.cli import help_width\n"
            "width = click.formatting.HelpFormatter().width\n"
            "print(loaded, width, help_width(), max(map(len, out.getvalue().splitlines())))\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    loaded, width, ours, longest = done.stdout.split()
    assert loaded == "False" and ours == width
    assert int(width) - 12 <= int(longest) <= int(width)
