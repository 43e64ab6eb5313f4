"""Lint configuration: ``[tool.autoport-cst.lint]`` in ``pyproject.toml``.

The nearest ``pyproject.toml`` that has a ``[tool.autoport-cst]`` table,
walking up from each input file, configures that file. Unknown keys, wrong
types and selectors that match no rule are errors (exit code 2), reported
with the file and the key.

```toml
[tool.autoport-cst.lint]
select = ["NRN"]                 # codes, prefixes, rule names or "ALL" (default: all)
ignore = ["NRN005"]
exclude = ["build/**"]           # globs, relative to this file's directory
per-file-ignores = { "legacy/*.py" = ["NRN001"] }
forward-roots = ["run_step"]     # more entry points of the forward path
forward-exclude = ["debug_dump"] # functions the forward path never enters
warnings-as-errors = false       # warnings fail the run too
cache-dir = ".autoport-cst-cache"

[tool.autoport-cst.lint.options.NRN005]
allow = ["GptOssExperts.router_weight"]
```
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoport_cst import __version__
from autoport_cst.errors import InputError, MultiInputError, Position

TABLE = "autoport-cst"
# sections of [tool.autoport-cst] owned by other commands: accepted, not read here
OTHER_SECTIONS = frozenset({"apply", "plan", "validate", "port", "codemods", "schema", "tiny"})

LINT_KEYS = {
    "select": "list[str]",
    "ignore": "list[str]",
    "exclude": "list[str]",
    "per-file-ignores": "table",
    "forward-roots": "list[str]",
    "forward-exclude": "list[str]",
    "warnings-as-errors": "bool",
    "cache-dir": "str",
    "options": "table",
}

SYNTAX_ERROR = "NRN999"


@dataclass(frozen=True)
class LintSettings:
    """Resolved settings for the files under one configuration."""

    select: tuple[str, ...] = ("ALL",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    forward_roots: tuple[str, ...] = ()
    forward_exclude: tuple[str, ...] = ()
    warnings_as_errors: bool = False
    cache_dir: str | None = None
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    root: str | None = None  # directory of the configuration file
    source: str | None = None  # the configuration file

    # -- selection ----------------------------------------------------------

    def with_cli(self, select: list[str] | None, ignore: list[str] | None) -> LintSettings:
        new = self
        if select:
            check_selectors(select, "--select")
            new = replace(new, select=tuple(select))
        if ignore:
            check_selectors(ignore, "--ignore")
            new = replace(new, ignore=new.ignore + tuple(ignore))
        return new

    def enabled(self, path: str | None = None) -> frozenset[str]:
        """Codes of the rules that run on ``path``."""
        codes = expand(self.select) - expand(self.ignore)
        if path is not None and self.per_file_ignores:
            rel = self.relative(path)
            for pattern, selectors in self.per_file_ignores:
                if _glob_match(rel, pattern):
                    codes -= expand(selectors)
        return frozenset(codes | {SYNTAX_ERROR})

    def relative(self, path: str) -> str:
        absolute = os.path.abspath(path)
        if self.root:
            try:
                return Path(absolute).relative_to(self.root).as_posix()
            except ValueError:
                pass
        return Path(path).as_posix()

    def excluded(self, path: str) -> bool:
        if not self.exclude:
            return False
        rel = self.relative(path)
        return any(_glob_match(rel, pattern) for pattern in self.exclude)

    def rule_options(self, code: str) -> Mapping[str, Any]:
        return self.options.get(code, {})

    def fingerprint(self, enabled: frozenset[str]) -> str:
        """What the lint result of a file depends on besides its content."""
        data = {
            "version": __version__,
            "engine": _engine_signature(),
            "enabled": sorted(enabled),
            "options": {c: dict(self.options.get(c, {})) for c in sorted(enabled)},
            "forward-roots": list(self.forward_roots),
            "forward-exclude": list(self.forward_exclude),
            "warnings-as-errors": self.warnings_as_errors,
        }
        blob = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.blake2b(blob, digest_size=16).hexdigest()


def _glob_match(rel: str, pattern: str) -> bool:
    pattern = pattern.rstrip("/")
    if fnmatch.fnmatchcase(rel, pattern):
        return True
    if pattern.endswith("/**") and (rel == pattern[:-3] or rel.startswith(pattern[:-2])):
        return True
    if "/" not in pattern:  # a bare name matches any path component
        return any(fnmatch.fnmatchcase(part, pattern) for part in rel.split("/"))
    return False


_SIGNATURE: str | None = None


def _engine_signature() -> str:
    """Changes whenever a file of the lint package or of the transform
    package its rules read code with changes (so a cache written by an edited
    checkout is not reused), and with the installed transformers' version
    (NRN008 reads its config classes' aliases from its source)."""
    global _SIGNATURE
    if _SIGNATURE is None:
        _SIGNATURE = signature(Path(__file__).parent.parent, _installed_version("transformers"))
    return _SIGNATURE


def signature(package: Path, transformers_version: str | None) -> str:
    """A digest of the size and modification time of each ``.py`` file under
    ``package``'s ``lint`` and ``transform`` directories, and of the version
    of transformers."""
    digest = hashlib.blake2b(digest_size=12)
    for base in (package / "lint", package / "transform"):
        for path in sorted(base.rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    digest.update(f"transformers {transformers_version}".encode())
    return digest.hexdigest()


def _installed_version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# -- selectors ------------------------------------------------------------------


def expand(selectors: tuple[str, ...] | list[str]) -> set[str]:
    from autoport_cst.lint.rules import registry

    rules = registry()
    out: set[str] = set()
    for selector in selectors:
        out |= _match(selector, rules)
    return out


def _match(selector: str, rules) -> set[str]:
    if selector.upper() == "ALL":
        return set(rules)
    by_name = {rule.NAME: code for code, rule in rules.items()}
    if selector in by_name:
        return {by_name[selector]}
    upper = selector.upper()
    return {code for code in rules if code.startswith(upper)}


def check_selectors(selectors, where: str, source: str = "<command line>") -> None:
    from autoport_cst.lint.rules import registry

    rules = registry()
    errors = []
    for selector in selectors:
        if not isinstance(selector, str) or not _match(selector, rules):
            known = ", ".join(f"{c} ({r.NAME})" for c, r in rules.items())
            errors.append(
                InputError(f"{where}: {selector!r} matches no rule; rules are {known}", Position(source))
            )
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise MultiInputError(f"{source}: invalid rule selectors", errors)


# -- discovery and loading --------------------------------------------------------

_FOUND: dict[str, str | None] = {}
_LOADED: dict[str, LintSettings] = {}


def find_config(directory: str) -> str | None:
    """The nearest pyproject.toml with a [tool.autoport-cst] table at or
    above ``directory``."""
    directory = os.path.abspath(directory)
    visited = []
    current = directory
    result: str | None = None
    while True:
        if current in _FOUND:
            result = _FOUND[current]
            break
        visited.append(current)
        candidate = os.path.join(current, "pyproject.toml")
        if os.path.isfile(candidate) and _has_table(candidate):
            result = candidate
            break
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in visited:
        _FOUND[path] = result
    return result


def _has_table(path: str) -> bool:
    data = _read_toml(path)
    return isinstance(data.get("tool"), dict) and TABLE in data["tool"]


_TOML: dict[str, dict] = {}


def _read_toml(path: str) -> dict:
    if path not in _TOML:
        import tomllib  # only the lint command reads a configuration (apply lints with the defaults)

        try:
            with open(path, "rb") as handle:
                _TOML[path] = tomllib.load(handle)
        except tomllib.TOMLDecodeError as error:
            raise InputError(f"invalid TOML: {error}", Position(path)) from None
        except OSError as error:
            raise InputError(f"cannot read: {error}", Position(path)) from None
    return _TOML[path]


def settings_for(path: str, explicit_config: str | None = None) -> LintSettings:
    """Settings for one input file (or directory)."""
    if explicit_config is not None:
        return load_config(explicit_config)
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    config = find_config(directory)
    if config is None:
        return LintSettings()
    return load_config(config)


def load_config(path: str) -> LintSettings:
    path = os.path.abspath(path)
    if path in _LOADED:
        return _LOADED[path]
    data = _read_toml(path)
    table = data.get("tool", {}).get(TABLE, {})
    settings = parse_table(table, path)
    _LOADED[path] = settings
    return settings


class _Problems:
    """The errors of one configuration file, each at its key, in the order found."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.errors: list[InputError] = []

    def __call__(self, key: str, message: str) -> None:
        self.errors.append(InputError(message, Position(self.source, json_path=key)))

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise MultiInputError(f"{self.source}: invalid [tool.{TABLE}] configuration", self.errors)


def parse_table(table: Any, source: str) -> LintSettings:
    """Validate ``[tool.autoport-cst]`` (as a dict); errors name the key."""
    from autoport_cst.lint.rules import registry

    problem = _Problems(source)
    prefix = f"tool.{TABLE}"
    if not isinstance(table, dict):
        raise InputError("expected a table", Position(source, json_path=prefix))
    for key in table:
        if key != "lint" and key not in OTHER_SECTIONS:
            known = f"lint, {', '.join(sorted(OTHER_SECTIONS))}"
            problem(f"{prefix}.{key}", f"unknown key {key!r} (known: {known})")
    lint = table.get("lint", {})
    if not isinstance(lint, dict):
        problem(f"{prefix}.lint", "expected a table")
        lint = {}
    values = _typed_values(lint, f"{prefix}.lint", problem)
    rules = registry()
    for key in ("select", "ignore"):
        for selector in values.get(key, []):
            if not _match(selector, rules):
                problem(f"{prefix}.lint.{key}", f"{selector!r} matches no rule")
    per_file = _per_file_ignores(values.get("per-file-ignores", {}), rules, f"{prefix}.lint", problem)
    options = _rule_options(values.get("options", {}), rules, f"{prefix}.lint", problem)
    problem.raise_any()
    return _settings(values, per_file, options, source)


def _typed_values(lint: dict, where: str, problem: _Problems) -> dict[str, Any]:
    """The ``lint`` keys that are known and of their type (``LINT_KEYS``)."""
    expected = {
        "list[str]": "expected a list of strings",
        "bool": "expected true or false",
        "str": "expected a string",
        "table": "expected a table",
    }
    values: dict[str, Any] = {}
    for key, value in lint.items():
        kind = LINT_KEYS.get(key)
        if kind is None:
            problem(f"{where}.{key}", f"unknown key {key!r} (known: {', '.join(sorted(LINT_KEYS))})")
        elif not _of_kind(value, kind):
            problem(f"{where}.{key}", expected[kind])
        else:
            values[key] = value
    return values


def _of_kind(value: Any, kind: str) -> bool:
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return isinstance(value, dict)  # "table"


def _per_file_ignores(
    table: dict, rules: Mapping[str, Any], where: str, problem: _Problems
) -> list[tuple[str, tuple[str, ...]]]:
    """``per-file-ignores``: (glob, selectors) pairs whose selectors are lists of strings."""
    per_file: list[tuple[str, tuple[str, ...]]] = []
    for pattern, selectors in table.items():
        key = f"{where}.per-file-ignores.{pattern}"
        if not (isinstance(selectors, list) and all(isinstance(s, str) for s in selectors)):
            problem(key, "expected a list of rule selectors")
            continue
        for selector in selectors:
            if not _match(selector, rules):
                problem(key, f"{selector!r} matches no rule")
        per_file.append((pattern, tuple(selectors)))
    return per_file


def _rule_options(
    table: dict, rules: Mapping[str, Any], where: str, problem: _Problems
) -> dict[str, dict[str, Any]]:
    """``options``: per rule (by code or name), the options it declares, checked."""
    options: dict[str, dict[str, Any]] = {}
    by_name = {rule.NAME: code for code, rule in rules.items()}
    for name, opts in table.items():
        key = f"{where}.options.{name}"
        code = name if name in rules else by_name.get(name)
        if code is None:
            problem(key, f"unknown rule {name!r}")
            continue
        if not isinstance(opts, dict):
            problem(key, "expected a table")
            continue
        declared = rules[code].OPTIONS
        for opt, value in opts.items():
            if opt not in declared:
                known = ", ".join(sorted(declared)) or "none"
                problem(f"{key}.{opt}", f"unknown option {opt!r} of {code} (known: {known})")
                continue
            message = declared[opt].check(value)
            if message:
                problem(f"{key}.{opt}", message)
                continue
            options.setdefault(code, {})[opt] = value
    return options


def _settings(
    values: dict[str, Any],
    per_file: list[tuple[str, tuple[str, ...]]],
    options: dict[str, dict[str, Any]],
    source: str,
) -> LintSettings:
    """The settings of a valid table; paths relative to the file's directory."""
    root = os.path.dirname(source) if os.path.isabs(source) else None
    cache_dir = values.get("cache-dir")
    if cache_dir is not None and root is not None and not os.path.isabs(cache_dir):
        cache_dir = os.path.join(root, cache_dir)
    return LintSettings(
        select=tuple(values.get("select", ["ALL"])),
        ignore=tuple(values.get("ignore", [])),
        exclude=tuple(values.get("exclude", [])),
        per_file_ignores=tuple(per_file),
        forward_roots=tuple(values.get("forward-roots", [])),
        forward_exclude=tuple(values.get("forward-exclude", [])),
        warnings_as_errors=values.get("warnings-as-errors", False),
        cache_dir=cache_dir,
        options=options,
        root=root,
        source=source,
    )


def clear_caches() -> None:
    """Forget discovered and loaded configuration (tests, long-lived processes)."""
    _FOUND.clear()
    _LOADED.clear()
    _TOML.clear()
