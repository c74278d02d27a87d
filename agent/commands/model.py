"""``edgeagent model push DIR URL`` puts a model version where agents pull it from (an
OCI registry, as ORAS writes an artifact, or an S3 prefix), with no ORAS or AWS CLI;
``edgeagent model ls URL`` lists what a source holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def _options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs as source options (values read as YAML: true, 5, text)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected key=value", param_hint="--option")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _open(url: str, options: tuple[str, ...]) -> Any:
    from agent.sources import SourceError, open_source

    try:
        return open_source(url, _options(options))
    except SourceError as exc:
        raise click.ClickException(str(exc)) from None


_OPTION = click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
                       help="A source option (endpoint_url=..., region=..., insecure=true, "
                            "username=...); repeat for several.")


@click.group("model")
def model() -> None:
    """Put model versions where agents pull them from, and list what a source holds."""


@model.command("push")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("url")
@click.option("--version", type=click.IntRange(min=1),
              help="The version to write (oci://: the tag, unless the URL names one; "
                   "s3://: required).")
@_OPTION
def push(directory: Path, url: str, version: int | None, options: tuple[str, ...]) -> None:
    """Upload the files of one version DIRECTORY (e.g. repo/resnet/2) to URL:
    oci://registry/repository[:tag] or s3://bucket/prefix."""
    from agent.commands.progress import after
    from agent.sources import SourceError

    source = _open(url, options)
    try:
        with after(f"pushing {directory} to {source.display_url} ..."):
            _push(source, directory, url, version)
    except SourceError as exc:
        raise click.ClickException(str(exc)) from None


def _push(source: Any, directory: Path, url: str, version: int | None) -> None:
    """Push ``directory`` as ``url``'s version (oci:// or s3://), saying where."""
    if url.startswith("oci://"):
        if version is not None and getattr(source, "tag", None) not in (None, str(version)):
            raise click.ClickException(f"{source.display_url} names tag {source.tag}, "
                                       f"not --version {version}")
        digest = source.push(directory, None if version is None else str(version))
        click.echo(f"pushed {directory} to {source.display_url}"
                   f"{'' if source.tag or version is None else f':{version}'} ({digest})")
    elif url.startswith("s3://"):
        if version is None:
            raise click.ClickException("s3:// needs --version (the prefix's subdirectory)")
        from agent.sources.transfer import tree_digest

        keys = source.push(directory, version)
        click.echo(f"pushed {len(keys)} file(s) from {directory} to "
                   f"{source.display_url}/{version}/ ({tree_digest(directory)})")
    else:
        raise click.ClickException("push writes to oci:// or s3:// only")


@model.command("ls")
@click.argument("url")
@_OPTION
def ls(url: str, options: tuple[str, ...]) -> None:
    """List the versions a source holds and each version's files (size, digest)."""
    from agent.sources import SourceError

    source = _open(url, options)
    try:
        for version in source.versions():
            for f in source.files(version):
                click.echo(f"{version}\t{f.path}\t{f.size}\t{f.digest or '-'}")
    except SourceError as exc:
        raise click.ClickException(str(exc)) from None
