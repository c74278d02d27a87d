"""The documentation stays true to the code: README.md is short and maps docs/, every
relative link resolves, every quoted ``.venv/bin/edgeagent`` command parses against the
CLI, every bench script is in docs/benchmarks.md, and no docstring or comment under
agent/ or cachepolicies/ carries a measured figure (those belong in docs/benchmarks.md,
with when and where they were taken)."""

from __future__ import annotations

import ast
import io
import re
import shlex
import tokenize
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agent.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
MAPPED = ("agent.md", "simulator.md", "coordinator.md", "operations.md", "architecture.md",
          "benchmarks.md")
PROGRAM = ".venv/bin/edgeagent"


# -- README and links ------------------------------------------------------------------
def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move detail into docs/"


def _links(page: Path) -> list[str]:
    """The targets of ``[text](target)`` and ``![alt](target)`` outside code."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}


def test_readme_maps_every_docs_page_and_they_exist():
    mapped = {Path(t.split("#")[0]).name for t in _links(README) if t.startswith("docs/")
              and t.split("#")[0].endswith(".md")}
    assert set(MAPPED) <= mapped, f"README.md does not map {set(MAPPED) - mapped}"
    for name in mapped:
        assert (DOCS / name).is_file(), f"README.md maps docs/{name}, which does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_every_bench_script_is_in_benchmarks_md():
    text = (DOCS / "benchmarks.md").read_text()
    missing = [p.name for p in sorted((ROOT / "bench").glob("*.py"))
               if not p.name.startswith("_") and f"bench/{p.name}" not in text]
    assert not missing, f"docs/benchmarks.md says nothing of {missing}"


# -- quoted commands -------------------------------------------------------------------
def quoted_commands(text: str) -> list[str]:
    """Every command in ``text`` that starts with ``.venv/bin/edgeagent``: the lines of
    fenced code blocks (a ``\\`` continuation joined to its next line) and inline code."""
    found = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            if line.strip().startswith(PROGRAM):
                found.append(line.strip())
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [span.strip() for span in re.findall(r"`([^`]+)`", prose)
              if span.strip().startswith(PROGRAM)]
    return found


def _arguments(command: str) -> list[str]:
    """The command's words after the program, up to a shell operator or a comment."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if word and set(word) <= set(";&|<>"):
            break
        words.append(word)
    assert words and words[0] == PROGRAM, command
    return words[1:]


# Types whose conversion needs no file and no network: the rest (paths, files) are taken
# as they are.
_CHECKED_TYPES = (click.Choice, click.types.IntParamType, click.types.FloatParamType,
                  click.types.BoolParamType)


def _convert(param: click.Parameter, value: str, ctx: click.Context) -> str | None:
    if "$" in value or not isinstance(param.type, _CHECKED_TYPES):
        return None
    try:
        param.type.convert(value, param, ctx)
    except click.BadParameter as exc:
        return f"{param.name}={value!r}: {exc.message}"
    return None


def check_command(command: str) -> list[str]:
    """What is wrong with ``command`` for the CLI (empty when nothing): a subcommand that
    does not exist, an option its command does not accept, a value its type refuses, a
    missing option value or too many arguments."""
    args = _arguments(command)
    ctx = click.Context(main, info_name="edgeagent")
    cmd: click.Command = main
    errors: list[str] = []
    positional = 0
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        where = ctx.command_path
        if word.startswith("-") and word != "-":
            name, eq, inline = word.partition("=")
            if name in ctx.help_option_names:
                continue
            option = next((p for p in cmd.get_params(ctx) if isinstance(p, click.Option)
                           and name in (*p.opts, *p.secondary_opts)), None)
            if option is None:
                errors.append(f"{where}: no option {name}")
                continue
            if option.is_flag or option.count:
                if eq:
                    errors.append(f"{where}: {name} is a flag and takes no value")
                continue
            values = [inline] if eq else args[i:i + option.nargs]
            i += 0 if eq else option.nargs
            if len(values) < option.nargs:
                errors.append(f"{where}: {name} needs a value")
            errors += [f"{where}: {e}" for v in values if (e := _convert(option, v, ctx))]
        elif isinstance(cmd, click.Group):
            sub = cmd.get_command(ctx, word)
            if sub is None:
                errors.append(f"{where}: no command {word!r}")
                break
            cmd, ctx, positional = sub, click.Context(sub, info_name=word, parent=ctx), 0
        else:
            arguments = [p for p in cmd.get_params(ctx) if isinstance(p, click.Argument)]
            slots = [a for a in arguments for _ in range(max(a.nargs, 1))]
            if positional < len(slots):
                e = _convert(slots[positional], word, ctx)
                errors += [f"{where}: {e}"] if e else []
            elif not any(a.nargs == -1 for a in arguments):
                errors.append(f"{where}: unexpected argument {word!r}")
            positional += 1
    return errors


def _command_paths(command: str) -> tuple[str, ...]:
    """The subcommand path a command names (its leading words that are commands)."""
    path, cmd, ctx = [], main, click.Context(main, info_name="edgeagent")
    for word in _arguments(command):
        if not isinstance(cmd, click.Group) or word.startswith("-"):
            if word.startswith("-") and isinstance(cmd, click.Group):
                continue
            break
        cmd = cmd.get_command(ctx, word)
        if cmd is None:
            break
        ctx = click.Context(cmd, info_name=word, parent=ctx)
        path.append(word)
    return tuple(path)


COMMANDS = [(page.relative_to(ROOT).as_posix(), command)
            for page in PAGES for command in quoted_commands(page.read_text())]


def test_the_docs_quote_commands():
    pages = {page for page, _ in COMMANDS}
    assert "README.md" in pages and len(COMMANDS) > 30, pages


@pytest.mark.parametrize("page, command", COMMANDS,
                         ids=[f"{page}-{i}" for i, (page, _) in enumerate(COMMANDS)])
def test_quoted_command_parses(page, command):
    errors = check_command(command)
    assert not errors, f"{page}: {command}\n" + "\n".join(errors)


def test_quoted_commands_help_runs():
    """``--help`` of every subcommand the docs quote answers (the lazy group imports it)."""
    runner = CliRunner()
    for path in sorted({_command_paths(c) for _, c in COMMANDS}):
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)


@pytest.mark.parametrize("command, problem", [
    (".venv/bin/edgeagent simulate --demo --polcy lru", "no option --polcy"),
    (".venv/bin/edgeagent simulate --queueing=yes", "is a flag"),
    (".venv/bin/edgeagent serve --port 70000", "port='70000'"),
    (".venv/bin/edgeagent serve --log-level loud", "log_level='loud'"),
    (".venv/bin/edgeagent plan allocate --problem p.json --objective most", "objective"),
    (".venv/bin/edgeagent cache workers mlp 2 3", "unexpected argument '3'"),
    (".venv/bin/edgeagent cache workers mlp many", "count='many'"),
    (".venv/bin/edgeagent coordinator modles ls", "no command 'modles'"),
    (".venv/bin/edgeagent workload trace --downsample", "needs a value"),
])
def test_the_command_check_catches(command, problem):
    errors = check_command(command)
    assert any(problem in e for e in errors), errors


def test_the_command_check_accepts_what_the_cli_accepts():
    assert check_command(".venv/bin/edgeagent cache --url http://h:1 ls --json") == []
    assert check_command(".venv/bin/edgeagent simulate --no-progress --capacity=8GB "
                         "--policy cremebrulee:rate=cumulative --json > $out/x.json") == []
    assert check_command(".venv/bin/edgeagent profile measure a b c --runs 3  # note") == []


def test_a_renamed_option_fails_the_docs(monkeypatch):
    """The docs quote ``simulate --capacity``; were the option renamed, each such command
    would fail here."""
    quoted = [c for _, c in COMMANDS if " simulate " in c and "--capacity" in c]
    assert quoted and all(check_command(c) == [] for c in quoted)
    simulate = main.get_command(click.Context(main), "simulate")
    option = next(p for p in simulate.params if p.name == "capacities")
    monkeypatch.setattr(option, "opts", ["--capacities"])
    for command in quoted:
        assert "edgeagent simulate: no option --capacity" in check_command(command)


# -- no measured figures in docstrings and comments -------------------------------------
_NUM = r"\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUM}(?:\s?[-–]\s?{_NUM})?"
#: A number (or a range) with a unit of time, size or share, or a ratio: ``4x``, and
#: ``1.6-2.0 x`` (a spaced ``x`` after a single number is a product: ``0.9 × b``); a bare
#: ``s`` needs its space (``503s`` are statuses).
FIGURE = re.compile(
    rf"(?<![\w.$/+-])(?P<approx>(?:~|\babout|\broughly|\baround|\bnearly) ?)?"
    rf"(?P<number>{_RANGE}(?:\s?(?:ns|µs|us|ms|KiB|kB|KB|MiB|MB|GiB|GB|TB|%)|\s(?:s|min)|[x×])"
    rf"|{_NUM}\s?[-–]\s?{_NUM}\s[x×])(?![\w/])")
#: A range of fractions: measurements scatter, contracts do not.
_SCATTER = re.compile(r"\d\.\d+\s?[-–]|[-–]\s?\d+\.\d")
#: Words that make a sentence with a figure read as a measurement.
CUES = re.compile(r"\b(?:took|takes|taking|faster|slower|speed-?up|benchmarks?|bench/\w+|"
                  r"costs?|saved|saves|stall(?:s|ed)?|held|hold|holds|holding|spent|"
                  r"load average|on this box|median|optimum)\b")
#: A figure compared with another: "5 s → 0.4 s", "294 s against 62 s", "instead of ~50 %".
COMPARED = re.compile(rf"{_NUM}\s?(?:[a-zA-Zµ%×]+)?\s*(?:→|->|against|instead of|vs\.?|"
                      rf"versus)\s*~?\s?{_NUM}\s?(?:s|ms|µs|us|%|x|×|[KMGT]i?B)(?![\w/])")


def measured_figures(text: str) -> list[str]:
    """The sentences of ``text`` that carry a measured figure: a number with a unit of
    time, size, share or ratio that is approximate (``~0.1 s``, ``about 3x``), a range of
    fractions (``0.3-0.8 s``), compared with another figure (``5 s → 0.4 s``), or in a
    sentence that says it was measured (took, costs, faster, median, ...). Inline code
    (``512MB``) is an example, not a figure. A default or a bound (``64 MiB``, ``10 s in
    Faro``, ``cut by 10 %``) has none of these marks."""
    text = re.sub(r"``[^`]*``|`[^`]*`", "", text)
    found = []
    for sentence in re.split(r"(?<=[.;!?])\s+|\n\s*\n", " ".join(text.split("\n"))):
        sentence = " ".join(sentence.split())
        figures = list(FIGURE.finditer(sentence))
        if figures and (any(f["approx"] or _SCATTER.search(f["number"]) for f in figures)
                        or COMPARED.search(sentence) or CUES.search(sentence)):
            found.append(sentence)
    return found


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment in a Python file."""
    source = path.read_text()
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                texts.append((node.body[0].lineno, doc))
    comments: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line, text = tok.start[0], tok.string.lstrip("#:").strip()
            if comments and comments[-1][0] + comments[-1][1].count("\n") == line - 1:
                comments[-1] = (comments[-1][0], comments[-1][1] + "\n" + text)
            else:
                comments.append((line, text))
    return texts + comments


def _sources() -> list[Path]:
    return [p for pkg in ("agent", "cachepolicies") for p in sorted((ROOT / pkg).rglob("*.py"))
            if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


def test_no_docstring_or_comment_carries_a_measured_figure():
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for line, text in _texts(path):
            found += [f"{rel}:{line}: {sentence}" for sentence in measured_figures(text)]
    assert not found, ("measured figures belong in docs/benchmarks.md (with when and "
                       "where), not in the code:\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "Start from the store's nodes: its models read once here (parse_report: ~1.3 s at "
    "10,000 nodes).",
    "The validating parse took 2 s for 10,000 nodes.",
    "A report costs it ~0.2-0.4 ms of CPU (HTTP, validation, the answer).",
    "Threaded BLAS on 2 busy cores made bench/ribbon.py 4x slower (294 s against 62-78 s).",
    "Without it the greedy stops and relaunches around every dip (5.6 % above the optimum "
    "on random_cases(28) instead of 0.4 %).",
    "It costs money with a good forecast (12.3 % above the optimum on the small cases).",
    "only to learn whether BLAS exists (0.3-0.8 s, numpy.f2py included).",
    "RSS = weights + 0.5-0.8 MiB (the arena's first chunk) on the demo MLPs.",
    "A fixed threshold cuts the apparent load footprint by ~30 % and lets an unload free "
    "80-100 % instead of ~50 %.",
    "fromiter with a count: about 3x faster than np.array over a repeated field",
    "one write of 50 MB holds the loop for a quarter of a second",
    "Placement: 13 s → 0.4 s at 10,000 nodes.",
    "The demo zoo: ~155 MB resident in all.",
])
def test_the_figure_check_catches(text):
    assert measured_figures(text), text


@pytest.mark.parametrize("text", [
    "Request bodies over 64 MiB get 413 (max_request_size).",
    "Sizes take bytes or units: ``512MB``, ``2GiB``.",
    "the grid DROP_GRID (0 to 20 % in 0.5 % steps, which contains every corner)",
    "Faro's 5-min plans over a 7-min window at the 0.9 quantile, a 10 s reactive loop "
    "that acts after 3 violations.",
    "The limit is cut by 10 % when a batch exceeds it; never above max_batch_size.",
    "the paper's example (p = 150 ms, λ = 40/s, SLO 600 ms → 10 replicas).",
    "aiohttp drains the rest for at most as long (its lingering time, 10 s by default).",
    "glibc raises its mmap threshold dynamically (up to 32 MiB) after large frees.",
    "waiting must beat unbatched throughput by WAIT_GAIN (10 %): W_b + T_b ≤ 0.9 × b × T_1.",
])
def test_the_figure_check_lets_contracts_be(text):
    assert measured_figures(text) == [], text
