"""Typed declarations applied to what comes from outside.

A declaration is a tree of msgspec Structs whose fields carry their type and a
``msgspec.Meta``: bounds (``ge``, ``gt``, ``le``, ``lt``, ``min_length``, ``max_length``,
``pattern``), the help text (``description``) and, through ``setting``, what the example
file shows and a checker for what a type cannot say (sizes such as ``2GiB``, devices).
Configurations are ``Section``s (``agent.config``, ``agent.coordinator.config``); the
node report and the directives are Structs that msgspec decodes straight from bytes
(``agent.wire``). From a declaration come:

* ``load``: a configuration mapping as an instance; an unknown key or a bad value is a
  ``ConfigError`` naming the file and the dotted key in ``agent.validation``'s words
  (``slo.latency_ms: must be a number > 0, got 'fast'``);
* ``explain``: why a document does not fit a wire type, the field named the same way
  (msgspec's own errors show ``$.models[...]`` without the key);
* ``example_yaml``: the documented example file (``edgeagent config example``);
* ``settings``: each key's type, default and help, which the CLI's flags take.
"""

from __future__ import annotations

import functools
import json
import math
import re
import textwrap
from pathlib import Path
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi

from agent.units import exact_size
from agent.validation import (ConfigError, SchemaError, boolean, check, choice, load_json,
                              number, only, size, string)

_NO_EXAMPLE = object()


def setting(help: str, *, check: Any = None, example: Any = _NO_EXAMPLE,
            commented: bool | None = None, **bounds: Any) -> msgspec.Meta:
    """A configuration key's annotation: ``help`` (the example file's comment and the
    flag's help), ``bounds`` (msgspec's ``ge``, ``gt``, ``le``, ``lt``, ...), ``check``
    (a checker from ``agent.validation`` for a value the type cannot describe; it
    returns the converted value), ``example`` (the value the example file shows instead
    of the default) and ``commented`` (the example file shows the key commented out;
    None: when it has no default)."""
    extra: dict[str, Any] = {"commented": commented}
    if check is not None:
        extra["check"] = check
    if example is not _NO_EXAMPLE:
        extra["example"] = example
    return msgspec.Meta(description=help, extra=extra, **bounds)


# Value types that declarations share: their bounds (the help is per key).
Text = Annotated[str, msgspec.Meta(min_length=1)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
AtLeastZero = Annotated[int, msgspec.Meta(ge=0)]
LOG_LEVELS = ("debug", "info", "warning", "error")
LogLevel = Annotated[str, setting("the log's level", check=choice(*LOG_LEVELS))]
# The servers' connection bounds (agent.http.connections), an agent's and a coordinator's.
MaxConnections = Annotated[AtLeastOne | None, setting(
    "open connections in all (an agent's gRPC listener holds as many of its own; each "
    "report worker as many); one more closes the oldest idle connection, or is closed "
    "when all are busy; left out: a quarter of the open-file limit (RLIMIT_NOFILE; the "
    "units set LimitNOFILE)", example=4096)]
MaxConnectionsPerPeer = Annotated[AtLeastOne | None, setting(
    "open connections from one address (likewise); left out: a quarter of "
    "max_connections", example=1024)]

#: A field of a configuration class that no file sets (filled in by code).
INTERNAL = msgspec.Meta(extra={"internal": True})


def expected(words: str, **bounds: Any) -> msgspec.Meta:
    """A wire type's bounds with what its values must be, for the message of a value
    (or a mapping's key) that breaks them: ``keys must be batch sizes >= 1``."""
    return msgspec.Meta(extra={"expected": words}, **bounds)


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A configuration, or a section of one (``slo:``): frozen, its keys its fields."""


class Setting(msgspec.Struct, frozen=True):
    """One key of a configuration declaration, as the CLI and the example file see it."""

    name: str
    type: Any  # msgspec.inspect type, without its Metadata
    help: str
    default: Any  # NODEFAULT when required
    computed: bool  # the default is made when the instance is (default_factory)
    extra: dict[str, Any]

    @property
    def check(self) -> Any:
        return self.extra.get("check")

    @property
    def value_type(self) -> Any:
        """The type of a value given (an optional key's type without its None)."""
        if isinstance(self.type, mi.UnionType):
            kinds = [k for k in self.type.types if not isinstance(k, mi.NoneType)]
            return _unwrap(kinds[0])[0] if len(kinds) == 1 else self.type
        return self.type

    @property
    def shown_default(self) -> str | None:
        """The default as a file would say it; None when there is none to show (None,
        required, or made per instance)."""
        if self.computed or self.default is None or self.default is msgspec.NODEFAULT:
            return None
        return _plain(self.default, self.check)


@functools.cache
def _info(cls: type) -> Any:
    return mi.type_info(cls)


def _unwrap(t: Any) -> tuple[Any, dict[str, Any], str]:
    """(the type inside any Metadata, its extra, its description)."""
    extra: dict[str, Any] = {}
    help = ""
    while isinstance(t, mi.Metadata):
        extra = {**(t.extra or {}), **extra}
        help = help or (t.extra_json_schema or {}).get("description", "")
        t = t.type
    return t, extra, help


def _default(f: Any) -> Any:
    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return msgspec.NODEFAULT


def settings(cls: type) -> dict[str, Setting]:
    """The keys a configuration class declares, in order (internal fields left out)."""
    out = {}
    for f in _info(cls).fields:
        t, extra, help = _unwrap(f.type)
        if not extra.get("internal"):
            out[f.name] = Setting(f.name, t, help, _default(f),
                                  f.default_factory is not msgspec.NODEFAULT, extra)
    return out


def _section_type(t: Any) -> Any:
    """The Struct type of ``t`` (a union with None included), else None."""
    kinds = t.types if isinstance(t, mi.UnionType) else (t,)
    for k in kinds:
        k = _unwrap(k)[0]
        if isinstance(k, mi.StructType):
            return k
    return None


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else f"{text[:57]}..."


_JSON_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")


class _Walk:
    """Checks a value against a type, converting it; ``SchemaError`` names the dotted
    key. ``config``: a configuration file (its keys are "keys", a mapping given as
    nothing reads as empty, a section merges onto the field's default section, paths
    are relative to ``base``); else a wire document (its keys are "fields")."""

    def __init__(self, *, config: bool, base: Path | None = None) -> None:
        self.config, self.base = config, base
        self.noun = "key" if config else "field"
        self.mapping = "a mapping" if config else "a JSON object"

    def value(self, t: Any, v: Any, key: str | None, base: Any = None) -> Any:
        t, extra, _ = _unwrap(t)
        if "check" in extra:
            return check(extra["check"], v, key)
        if isinstance(t, mi.UnionType):
            return self._union(t, v, key, base)
        if isinstance(t, mi.StructType) and t.array_like:
            return self._row(t, v, key)
        if isinstance(t, mi.StructType):
            return self._section(t, v, key, base)
        if isinstance(t, mi.DictType):
            return self._dict(t, v, key)
        if isinstance(t, (mi.ListType, mi.VarTupleType)):
            return self._list(t, v, key)
        return check(self._leaf(t, extra), v, key)

    def _union(self, t: Any, v: Any, key: str | None, base: Any) -> Any:
        kinds = [k for k in t.types if not isinstance(k, mi.NoneType)]
        section = _section_type(t)
        if v is None and section is not None and self.config:
            return self._section(section, {}, key, base)  # ``coordinator:`` given empty
        if v is None and len(kinds) < len(t.types):
            return None
        if len(kinds) != 1:
            raise TypeError(f"{key}: a union of {kinds} needs a checker (setting(check=))")
        return self.value(kinds[0], v, key, base)

    def _leaf(self, t: Any, extra: dict[str, Any]) -> Any:
        """The checker for a scalar type."""
        if isinstance(t, mi.BoolType):
            return boolean
        if isinstance(t, (mi.IntType, mi.FloatType)):
            lo = t.gt if t.gt is not None else t.ge
            hi = t.lt if t.lt is not None else t.le
            return number(lo, hi, strict_lo=t.gt is not None, strict_hi=t.lt is not None,
                          integer=isinstance(t, mi.IntType), finite=hi is not None)
        if isinstance(t, mi.StrType):
            return _string(t, extra.get("expected"))
        if isinstance(t, mi.CustomType) and issubclass(t.cls, Path):
            return self._path
        raise TypeError(f"no checker for {t!r}: give the key one (setting(check=))")

    def _path(self, v: Any) -> Path:
        """A non-empty string, relative to the file's directory (``base``)."""
        return ((self.base or Path.cwd()) / Path(string(v)).expanduser()).resolve()

    def _section(self, t: Any, v: Any, key: str | None, base: Any) -> Any:
        prefix = f"{key}." if key else ""
        if v is None and self.config:
            v = {}
        if type(v) is not dict:
            raise SchemaError(key, f"must be {self.mapping}, got {type(v).__name__}")
        fields = [f for f in t.fields if not _unwrap(f.type)[1].get("internal")]
        if self.config or t.forbid_unknown_fields:  # else a wire type leaves them out
            only(v, [f.encode_name for f in fields], prefix, noun=self.noun,
                 listed_in="`edgeagent config example`" if self.config else None)
        values = {}
        for f in fields:
            if f.encode_name in v:
                below = getattr(base, f.name) if base is not None else \
                    _default(f) if self.config else None
                values[f.name] = self.value(f.type, v[f.encode_name], prefix + f.name,
                                            below if isinstance(below, Section) else None)
            elif f.required and base is None:
                raise SchemaError(prefix + f.name,
                                  f"required when {key} is given" if key else "missing")
        return self._build(t, values, key, base)

    def _build(self, t: Any, values: dict[str, Any], key: str | None, base: Any) -> Any:
        """The instance; a ValueError from its ``__post_init__`` names ``key``."""
        try:
            return msgspec.structs.replace(base, **values) if base is not None \
                else t.cls(**values)
        except SchemaError as exc:  # a rule between fields, naming one of them
            raise SchemaError(f"{key}.{exc.key}" if key and exc.key else exc.key or key,
                              exc.message) from None
        except ValueError as exc:
            raise SchemaError(key, str(exc)) from None

    def _row(self, t: Any, v: Any, key: str) -> Any:
        """An array-like Struct (``[age_s, seconds, count]``): its fields in order."""
        names = [f.name for f in t.fields]
        if type(v) is not list or len(v) != len(names):
            raise SchemaError(key, f"must be [{', '.join(names)}]")
        values = {}
        for f, item in zip(t.fields, v):
            try:
                values[f.name] = self.value(f.type, item, key)
            except SchemaError as exc:
                raise SchemaError(key, f"{f.name} {exc.message}") from None
        return self._build(t, values, key, None)

    def _list(self, t: Any, v: Any, key: str | None) -> Any:
        if type(v) is not list:
            raise SchemaError(key, f"must be a list, got {type(v).__name__}")
        if t.max_length is not None and len(v) > t.max_length:
            raise SchemaError(key, f"must be a list of at most {t.max_length} items, got "
                              f"{len(v)}")
        items = [self.value(t.item_type, x, f"{key}[{i}]") for i, x in enumerate(v)]
        return tuple(items) if isinstance(t, mi.VarTupleType) else items

    def _dict(self, t: Any, v: Any, key: str | None) -> dict:
        if type(v) is not dict:
            raise SchemaError(key, f"must be {self.mapping}, got {type(v).__name__}")
        prefix = f"{key}." if key else ""
        return {self._key(t.key_type, k, key): self.value(t.value_type, item, f"{prefix}{k}")
                for k, item in v.items()}

    def _key(self, t: Any, k: Any, key: str | None) -> Any:
        """A mapping's key: a string, or an integer (written as one in JSON keys)."""
        inner, extra, _ = _unwrap(t)
        try:
            if isinstance(inner, mi.IntType) and not (type(k) is int and self.config):
                if not (isinstance(k, str) and k.isascii() and _JSON_INT_KEY.match(k)):
                    raise ValueError("not an integer")
                k = int(k)
            return check(self._leaf(inner, extra), k, key)
        except ValueError as exc:
            words = extra.get("expected")
            raise SchemaError(key, f"keys must be {words}, got {_shown(k)}" if words
                              else f"bad key {_shown(k)}: {exc}") from None


def _string(t: Any, words: str | None) -> Any:
    def check_string(v: Any) -> str:
        if isinstance(v, str) and (t.min_length is None or len(v) >= t.min_length) \
                and (t.max_length is None or len(v) <= t.max_length) \
                and (t.pattern is None or re.search(t.pattern, v)):
            return v
        if words:
            raise ValueError(f"must be {words}, got {_shown(v)}")
        if t.max_length is not None:
            raise ValueError(f"must be a string of at most {t.max_length} characters, "
                             f"got {_shown(v)}")
        if t.pattern is not None:
            raise ValueError(f"must be a string matching {t.pattern}, got {_shown(v)}")
        what = ("a string" if not t.min_length else "a non-empty string" if t.min_length == 1
                else f"a string of at least {t.min_length} characters")
        raise ValueError(f"must be {what}, got {_shown(v)}")
    return check_string


def load(cls: type, data: Any, file: str | Path | None = None) -> Any:
    """``data`` (a parsed YAML mapping; None reads as empty) as a ``cls`` instance;
    ``ConfigError`` names ``file`` and the dotted key. Relative paths are from ``file``'s
    directory."""
    walk = _Walk(config=True, base=Path(file).parent if file else None)
    try:
        return walk.value(_info(cls), data, None)
    except SchemaError as exc:
        raise ConfigError(file, exc.key, exc.message) from None


def explain(cls: type, doc: Any) -> SchemaError | None:
    """Why ``doc`` (parsed JSON) is not a ``cls`` (a wire type): the first bad field,
    named; None when it fits."""
    try:
        _Walk(config=False).value(_info(cls), doc, None)
    except SchemaError as exc:
        return exc
    return None


@functools.cache
def _decoder(cls: type) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(cls)


def decode(cls: type, body: bytes | str | Any) -> Any:
    """``body`` (JSON text, or data as parsed JSON) as a ``cls`` (a wire type), decoded
    by msgspec straight into it. ``SchemaError`` names the first bad field (msgspec's
    own path shows a mapping's key as ``[...]``: ``explain`` on the parsed body names it,
    in ``agent.validation``'s words); a body that is not JSON, or nests deeper than
    ``validation.MAX_JSON_DEPTH``, is a plain ``ValueError``."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    elif not isinstance(body, (bytes, bytearray, memoryview)):
        try:
            body = msgspec.json.encode(body)
        except (TypeError, ValueError) as exc:
            raise SchemaError(None, f"not JSON data: {exc}") from None
    try:
        return _decoder(cls).decode(body)
    except msgspec.DecodeError as exc:
        found = explain(cls, load_json(body))
        raise found or SchemaError(None, str(exc)) from None


# -- the example file ---------------------------------------------------------------------


def _plain(v: Any, checker: Any = None) -> str:
    """A scalar as a person writes it: ``true``, ``30`` (not ``30.0``), ``64MiB`` (a
    size: ``checker`` is ``size``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if checker is size and type(v) is int:
        return exact_size(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return str(int(v))
    return repr(v) if isinstance(v, float) else str(v)


def _scalar(v: Any) -> str:
    """``v`` as YAML reads it back (PyYAML says which strings need quotes)."""
    if isinstance(v, (bool, int, float)):
        return _plain(v)
    if isinstance(v, Path):
        v = str(v)
    if isinstance(v, str):
        import yaml

        plain = re.fullmatch(r"[\w/~$][\w./~$@+=,:-]*", v) and yaml.safe_load(v) == v
        return v if plain else json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_scalar(k)}: {_scalar(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no YAML for {v!r}")


def _comment(text: str, indent: str, width: int = 88) -> list[tuple[None, str]]:
    lines = textwrap.wrap(text, width - len(indent) - 2, break_on_hyphens=False)
    return [(None, f"{indent}# {line}") for line in lines]


def _entries(cls: type, indent: str, instance: Any) -> list[tuple[bool | None, str]]:
    """The example lines of ``cls``'s keys as (commented out?, text); None: a comment.
    ``instance``: the section's default when it differs from the class's (the agent's
    batching), whose values are shown."""
    out: list[tuple[bool | None, str]] = []
    for s in settings(cls).values():
        current = getattr(instance, s.name) if instance is not None else s.default
        off = s.extra.get("commented")
        section = None if s.check else _section_type(s.type)
        if section is not None:
            inner = _entries(section.cls, indent + "  ",
                             current if isinstance(current, Section) else None)
            if off is None:  # no default, or nothing below set: shown commented out
                off = current is None or all(c for c, _ in inner if c is not None)
            out += [*_comment(s.help, indent), (off, f"{indent}{s.name}:"),
                    *((c or off if c is not None else None, t) for c, t in inner)]
            continue
        overridden = instance is not None and current != s.default
        value = s.extra["example"] if "example" in s.extra and not overridden else current
        if value is None or value is msgspec.NODEFAULT:
            raise ValueError(f"{cls.__name__}.{s.name}: no value to show (setting(example=))")
        if s.check is size and type(value) is int:
            value = _plain(value, size)
        if off is None:  # no default: the example is shown commented out
            off = current is None or current is msgspec.NODEFAULT
        lines = [f"{indent}{s.name}: {_scalar(value)}"] if not isinstance(value, dict) \
            else [f"{indent}{s.name}:", *(f"{indent}  {_scalar(k)}: {_scalar(v)}"
                                          for k, v in value.items())]
        out += [*_comment(s.help, indent), *((off, line) for line in lines)]
    return out


def _commented_out(line: str) -> str:
    text = line.lstrip()
    return f"{line[:len(line) - len(text)]}# {text}"


def example_yaml(cls: type, title: str) -> str:
    """The example file of ``cls``: ``title`` and the class docstring as its head, then
    every key with its help above it, showing its example value or its default."""
    doc = " ".join(line.strip() for line in (cls.__doc__ or "").splitlines())
    head = [*(t for _, t in _comment(title, "")), *(t for _, t in _comment(doc, "")),
            "# Made from its declaration by `edgeagent config example`: edit that, not "
            "this file."]
    body = [_commented_out(t) if off else t for off, t in _entries(cls, "", None)]
    return "\n".join([*head, "", *body]) + "\n"
