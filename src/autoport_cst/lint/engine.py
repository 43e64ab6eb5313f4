"""The lint engine: read, parse once, one traversal for all rules, results
as data.

``lint_source`` parses a file with LibCST, walks the tree once and calls, for
each node, the engine's own bookkeeping (scopes, call graph, assignments,
enclosing statement) and then every enabled rule's ``visit_<Node>``. After
the walk it finalizes the module index, calls every rule's ``finish``, keeps
the findings whose scope holds (forward path, init path, anywhere), computes
positions for those findings only, applies suppression comments and returns
positioned :class:`Diagnostic` objects.

The walk reads node fields directly instead of using ``CSTNode.visit``: a
``CSTVisitor`` traversal rebuilds every node on the way back and costs about
as much as parsing, the direct walk about a fifth of that. Whitespace,
comments, commas, parentheses and operator tokens are not visited.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import libcst as cst

from autoport_cst.lint import suppressions as sup_mod
from autoport_cst.lint.config import SYNTAX_ERROR, LintSettings
from autoport_cst.lint.diagnostics import ERROR, WARNING, Diagnostic, Fix
from autoport_cst.lint.index import UNKNOWN, CallSite, ClassInfo, FunctionInfo, ModuleIndex, Site
from autoport_cst.lint.positions import positions
from autoport_cst.lint.rule import Rule
from autoport_cst.transform.cst.vocabulary import dotted, self_attr

if TYPE_CHECKING:
    from autoport_cst.lint.exprs import Types

INVALID_SUPPRESSION = "NRN900"
UNUSED_SUPPRESSION = "NRN901"

# -- the walk -------------------------------------------------------------------------

_SKIP_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "leading_lines",
        "lines_after_decorators",
        "header",
        "footer",
        "trailing_whitespace",
        "comma",
        "semicolon",
        "equal",
        "colon",
        "dot",
        "operator",
        "newline",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "first_line",
        "empty_lines",
        "star_tok",
        "asynchronous",
        "await_",
        "first_colon",
        "second_colon",
        "relative",
    }
)
_FIELDS: dict[type, tuple[str, ...]] = {}
_LEAVE = object()
_ENTER = object()


def _fields(t: type) -> tuple[str, ...]:
    found = _FIELDS.get(t)
    if found is None:
        found = tuple(
            f.name
            for f in dataclasses.fields(t)
            if not f.name.startswith("whitespace") and f.name not in _SKIP_FIELDS
        )
        if t is cst.FunctionDef:
            found = ("decorators", "params", "returns", "type_parameters", "body")
        elif t is cst.ClassDef:
            found = ("decorators", "bases", "keywords", "type_parameters", "body")
        _FIELDS[t] = found
    return found


_CSTNode = cst.CSTNode
_SEQ = (tuple, list)


class _IsNode(dict):
    """type -> whether its instances are LibCST nodes, decided once per type
    (``isinstance`` against LibCST's abstract node class costs several dict
    lookups when it fails, as it does for every string and sentinel field)."""

    def __missing__(self, kind: type) -> bool:
        found = self[kind] = issubclass(kind, _CSTNode)
        return found


_IS_NODE = _IsNode()
_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)


@dataclass
class Candidate:
    rule: Rule
    node: cst.CSTNode
    message: str
    site: Site
    severity: str
    fix: Fix | None
    scope: str


class LintContext:
    """Per-file state shared by the engine and the rules."""

    def __init__(self, path: str, module: cst.Module, settings: LintSettings) -> None:
        self.path = path
        self.module = module
        self.settings = settings
        self.index = ModuleIndex()
        self.scopes: list[ClassInfo | FunctionInfo] = []
        self.function: FunctionInfo | None = None
        self.cls: ClassInfo | None = None
        self.lambda_depth = 0
        self.calls: list[cst.Call] = []
        self.statements: list[cst.CSTNode] = []
        self.candidates: list[Candidate] = []
        self.top_of: dict[int, cst.CSTNode] = {}  # statement -> its top-level statement
        self._types: Types | None = None

    # -- for rules -------------------------------------------------------------

    @property
    def statement(self) -> cst.CSTNode | None:
        return self.statements[-1] if self.statements else None

    def site(self) -> Site:
        return Site(self.function, self.cls, self.statement, self.lambda_depth > 0)

    def add(
        self,
        rule: Rule,
        node: cst.CSTNode,
        message: str,
        *,
        site: Site | None,
        severity: str,
        fix: Fix | None,
        scope: str,
    ) -> None:
        self.candidates.append(Candidate(rule, node, message, site or self.site(), severity, fix, scope))

    @property
    def types(self) -> Types:
        """Tensor, device and dtype answers for this file (see ``exprs``);
        complete in ``finish``, when every assignment is known."""
        if self._types is None:
            from autoport_cst.lint.exprs import Types

            self._types = Types(self.index)
        return self._types

    def forward_path(self) -> set[FunctionInfo]:
        return self.index.forward_path(self.settings.forward_roots, self.settings.forward_exclude)

    def on_forward_path(self, fn: FunctionInfo | None) -> bool:
        return fn is not None and fn in self.forward_path()

    # -- bookkeeping (engine handlers) -----------------------------------------

    def _enter(self, node: cst.ClassDef | cst.FunctionDef) -> None:
        if isinstance(node, cst.ClassDef):
            self._enter_class(node)
        else:
            self._enter_function(node)

    def _enter_class(self, node: cst.ClassDef) -> None:
        parent = self.scopes[-1] if self.scopes else None
        qual = node.name.value if parent is None else f"{parent.qualname}.{node.name.value}"
        info = ClassInfo(
            name=node.name.value,
            qualname=qual,
            node=node,
            bases=tuple(dotted(arg.value) for arg in node.bases),
            top_level=parent is None,
        )
        self.index.classes.append(info)
        if parent is None:
            self.index.top_classes[info.name] = info
        self.scopes.append(info)
        self.cls = info
        self.function = None

    def _enter_function(self, node: cst.FunctionDef) -> None:
        parent = self.scopes[-1] if self.scopes else None
        name = node.name.value
        cls = parent if isinstance(parent, ClassInfo) else None
        outer = parent if isinstance(parent, FunctionInfo) else None
        qual = name if parent is None else f"{parent.qualname}.{name}"
        params: dict[str, cst.BaseExpression | None] = {}
        p = node.params
        for param in (*p.posonly_params, *p.params, *p.kwonly_params):
            params[param.name.value] = param.annotation.annotation if param.annotation else None
        for star in (p.star_arg, p.star_kwarg):
            if isinstance(star, cst.Param):
                params[star.name.value] = None
        decorators = []
        for dec in node.decorators:
            target = dec.decorator
            if isinstance(target, cst.Call):
                target = target.func
            decorators.append(dotted(target) or "")
        info = FunctionInfo(
            name=name,
            qualname=qual,
            node=node,
            cls=cls,
            parent=outer,
            decorators=tuple(decorators),
            params=params,
        )
        self.index.all_functions.append(info)
        if cls is not None:
            cls.methods[name] = info
        elif outer is not None:
            outer.nested[name] = info
        else:
            self.index.functions[name] = info
        self.scopes.append(info)
        self.function = info

    def _leave_scope(self, node: cst.CSTNode) -> None:
        self.scopes.pop()
        self.function = None
        self.cls = None
        for scope in reversed(self.scopes):
            if isinstance(scope, FunctionInfo):
                if self.function is None:
                    self.function = scope
            elif self.cls is None:
                self.cls = scope
                break
        if self.function is not None and self.function.cls is not None:
            self.cls = self.function.cls

    def _visit_call(self, node: cst.Call) -> None:
        self.calls.append(node)
        fn = self.function
        if fn is None:
            return
        func = node.func
        statement = self.statements[-1] if self.statements else None
        if isinstance(func, cst.Attribute):
            base = func.value
            if isinstance(base, cst.Name):
                if base.value in ("self", "cls"):
                    fn.calls.append(CallSite(node, "self", func.attr.value, None, statement))
                elif base.value[:1].isupper():
                    fn.calls.append(CallSite(node, "class", func.attr.value, base.value, statement))
            elif (
                isinstance(base, cst.Call) and isinstance(base.func, cst.Name) and base.func.value == "super"
            ):
                fn.calls.append(CallSite(node, "super", func.attr.value, None, statement))
        elif isinstance(func, cst.Name):
            fn.calls.append(CallSite(node, "name", func.value, None, statement))

    def _leave_call(self, node: cst.Call) -> None:
        self.calls.pop()

    def _visit_attribute(self, node: cst.Attribute) -> None:
        if self.function is not None:
            attr = self_attr(node)
            if attr is not None:
                self.function.self_loads.add(attr)

    def _assign_target(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        fn = self.function
        if isinstance(target, cst.Name):
            if fn is not None:
                fn.assigns.setdefault(target.value, []).append(value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._assign_target(element.value, UNKNOWN)
        elif isinstance(target, cst.StarredElement):
            self._assign_target(target.value, UNKNOWN)
        elif value is not None and fn is not None:
            attr = self_attr(target)
            cls = fn.method_class
            if attr is not None and cls is not None:
                cls.attrs.setdefault(attr, []).append((fn, value))

    def _visit_assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assign_target(target.target, node.value)

    def _visit_ann_assign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assign_target(node.target, node.value)

    def _visit_aug_assign(self, node: cst.AugAssign) -> None:
        # x += e: the type of x follows e (a tensor stays a tensor)
        self._assign_target(
            node.target,
            cst.BinaryOperation(node.target, cst.Add(), node.value)
            if isinstance(node.target, cst.Name)
            else UNKNOWN,
        )

    def _visit_named_expr(self, node: cst.NamedExpr) -> None:
        self._assign_target(node.target, node.value)

    def _visit_for(self, node: cst.For) -> None:
        self._assign_target(node.target, UNKNOWN)

    def _visit_comp_for(self, node: cst.CompFor) -> None:
        self._assign_target(node.target, UNKNOWN)

    def _visit_with_item(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._assign_target(node.asname.name, UNKNOWN)

    def _visit_lambda(self, node: cst.Lambda) -> None:
        self.lambda_depth += 1

    def _leave_lambda(self, node: cst.Lambda) -> None:
        self.lambda_depth -= 1

    def _visit_statement(self, node: cst.CSTNode) -> None:
        self.statements.append(node)
        self.top_of[id(node)] = self.statements[0]

    def _leave_statement(self, node: cst.CSTNode) -> None:
        self.statements.pop()

    def _leave_def(self, node: cst.CSTNode) -> None:
        self._leave_scope(node)
        self.statements.pop()


def _compound_types() -> list[type]:
    out = []
    for name in dir(cst):
        obj = getattr(cst, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, cst.BaseCompoundStatement)
            and obj is not cst.BaseCompoundStatement
            and not name.startswith("Base")
        ):
            out.append(obj)
    return out


_COMPOUND = _compound_types()


def _tables(ctx: LintContext, rules: list[Rule]):
    visit: dict[type, list[Callable]] = {}
    leave: dict[type, list[Callable]] = {}

    def on(table, t, handler):
        table.setdefault(t, []).append(handler)

    # engine first on the way in, last on the way out
    on(visit, cst.Call, ctx._visit_call)
    on(visit, cst.Attribute, ctx._visit_attribute)
    on(visit, cst.Assign, ctx._visit_assign)
    on(visit, cst.AnnAssign, ctx._visit_ann_assign)
    on(visit, cst.AugAssign, ctx._visit_aug_assign)
    on(visit, cst.NamedExpr, ctx._visit_named_expr)
    on(visit, cst.For, ctx._visit_for)
    on(visit, cst.CompFor, ctx._visit_comp_for)
    on(visit, cst.WithItem, ctx._visit_with_item)
    on(visit, cst.Lambda, ctx._visit_lambda)
    for t in (cst.SimpleStatementLine, *_COMPOUND):
        on(visit, t, ctx._visit_statement)
    for rule in rules:
        for attr in dir(type(rule)):
            if attr.startswith("visit_"):
                node_type = getattr(cst, attr[6:], None)
                if not isinstance(node_type, type):
                    raise TypeError(f"{type(rule).__name__}.{attr}: no LibCST node {attr[6:]}")
                on(visit, node_type, getattr(rule, attr))
    for rule in rules:
        for attr in dir(type(rule)):
            if attr.startswith("leave_"):
                node_type = getattr(cst, attr[6:], None)
                if not isinstance(node_type, type):
                    raise TypeError(f"{type(rule).__name__}.{attr}: no LibCST node {attr[6:]}")
                on(leave, node_type, getattr(rule, attr))
    on(leave, cst.Call, ctx._leave_call)
    on(leave, cst.Lambda, ctx._leave_lambda)
    for t in (cst.SimpleStatementLine, *_COMPOUND):
        if t in (cst.FunctionDef, cst.ClassDef):
            on(leave, t, ctx._leave_def)
        else:
            on(leave, t, ctx._leave_statement)
    return visit, leave


def walk(ctx: LintContext, module: cst.Module, rules: list[Rule]) -> None:
    visit, leave = _tables(ctx, rules)
    enter = ctx._enter
    stack: list[Any] = [module]
    pop = stack.pop
    push = stack.append
    fields_of = _fields
    is_node = _IS_NODE
    while stack:
        item = pop()
        if type(item) is tuple:
            marker, node = item
            if marker is _LEAVE:
                for handler in leave[type(node)]:
                    handler(node)
            else:
                enter(node)
            continue
        t = type(item)
        handlers = visit.get(t)
        if handlers is not None:
            for handler in handlers:
                handler(item)
        if t in leave:
            push((_LEAVE, item))
        children: list[Any] = []
        for name in fields_of(t):
            value = getattr(item, name)
            if is_node[type(value)]:
                children.append(value)
            elif type(value) in _SEQ:
                for child in value:
                    if is_node[type(child)]:
                        children.append(child)
        if t is cst.FunctionDef or t is cst.ClassDef:
            body = children.pop()
            children.append((_ENTER, item))
            children.append(body)
        children.reverse()
        stack.extend(children)


# -- running the rules on one module ------------------------------------------------------


def _rule_instances(ctx: LintContext, enabled: frozenset[str]) -> list[Rule]:
    from autoport_cst.lint.rules import registry

    out = []
    for code, rule_cls in registry().items():
        if code in enabled and not rule_cls.PSEUDO:
            out.append(rule_cls(ctx, ctx.settings.rule_options(code)))
    return out


def _in_scope(ctx: LintContext, cand: Candidate, init_scope: set[FunctionInfo] | None) -> bool:
    if cand.scope == "file":
        return True
    fn = cand.site.function
    if cand.scope == "forward":
        return ctx.on_forward_path(fn)
    if cand.scope == "init":
        return fn is not None and init_scope is not None and fn in init_scope
    raise ValueError(f"unknown rule scope {cand.scope!r}")


def lint_module(
    module: cst.Module,
    path: str = "<string>",
    settings: LintSettings | None = None,
    enabled: frozenset[str] | None = None,
    source: str | None = None,
) -> list[Diagnostic]:
    """Run the enabled rules on a parsed module."""
    settings = settings or LintSettings()
    enabled = enabled if enabled is not None else settings.enabled(path)
    ctx = LintContext(path, module, settings)
    rules = _rule_instances(ctx, enabled)
    if rules:
        walk(ctx, module, rules)
    ctx.index.finalize()
    for rule in rules:
        rule.finish()

    init_scope = None
    if any(c.scope == "init" for c in ctx.candidates):
        init_scope = set(ctx.index.init_roots())
    kept = [c for c in ctx.candidates if _in_scope(ctx, c, init_scope)]

    if source is None:
        source = module.code
    found = sup_mod.find(source, _known_codes())
    if not kept and not found:
        return []
    ranges = _ranges(ctx, module, kept, source)
    index = sup_mod.Index(found, source.splitlines())
    out = _candidate_diagnostics(kept, ranges, index, settings, path)
    out += _suppression_diagnostics(found, enabled, path)
    out.sort(key=Diagnostic.sort_key)
    return out


def _ranges(
    ctx: LintContext, module: cst.Module, kept: list[Candidate], source: str
) -> dict[int, tuple[int, int, int, int]]:
    """Positions of the candidates' nodes and statements (found from their
    top-level statements when every candidate has one)."""
    targets: list[cst.CSTNode] = []
    for cand in kept:
        targets.append(cand.node)
        if cand.site.statement is not None:
            targets.append(cand.site.statement)
    tops: dict[int, cst.CSTNode] = {}
    for cand in kept:
        stmt = cand.site.statement
        top = ctx.top_of.get(id(stmt)) if stmt is not None else None
        if top is None:
            return positions(module, targets, None, source)
        tops[id(top)] = top
    return positions(module, targets, tops.values(), source)


def _candidate_diagnostics(
    kept: list[Candidate],
    ranges: dict[int, tuple[int, int, int, int]],
    index: sup_mod.Index,
    settings: LintSettings,
    path: str,
) -> list[Diagnostic]:
    """The findings that no comment suppresses, once each."""
    out: list[Diagnostic] = []
    seen: set[tuple] = set()
    for cand in kept:
        rng = ranges.get(id(cand.node))
        if rng is None:  # pragma: no cover - a node outside the module
            continue
        start_line, start_col, end_line, end_col = rng
        stmt_line = start_line
        if cand.site.statement is not None and id(cand.site.statement) in ranges:
            stmt_line = ranges[id(cand.site.statement)][0]
        code = cand.rule.CODE
        if index.match(code, start_line, stmt_line) is not None:
            continue
        key = (code, start_line, start_col, cand.message)
        if key in seen:
            continue
        seen.add(key)
        severity = cand.severity
        if severity == WARNING and settings.warnings_as_errors:
            severity = ERROR
        out.append(
            Diagnostic(
                path=path,
                line=start_line,
                column=start_col + 1,
                end_line=end_line,
                end_column=end_col + 1,
                code=code,
                name=cand.rule.NAME,
                message=cand.message,
                severity=severity,
                fix=cand.fix,
            )
        )
    return out


def _suppression_diagnostics(
    found: list[sup_mod.Suppression], enabled: frozenset[str], path: str
) -> list[Diagnostic]:
    """Suppression comments that are invalid, and those that suppress nothing."""
    from autoport_cst.lint.rules import registry

    rules_by_code = registry()
    out: list[Diagnostic] = []
    for sup in found:
        if sup.problems and INVALID_SUPPRESSION in enabled:
            out += [_at_comment(sup, path, INVALID_SUPPRESSION, problem) for problem in sup.problems]
        if UNUSED_SUPPRESSION in enabled:
            out += [
                _at_comment(sup, path, UNUSED_SUPPRESSION, f"unused suppression: {code} reports nothing here")
                for code in sup.codes
                if code in enabled and code not in sup.used and not rules_by_code[code].PSEUDO
            ]
    return out


def _at_comment(sup: sup_mod.Suppression, path: str, code: str, message: str) -> Diagnostic:
    """A diagnostic of ``code`` on a suppression comment."""
    from autoport_cst.lint.rules import registry

    return Diagnostic(
        path=path,
        line=sup.line,
        column=sup.column + 1,
        end_line=sup.line,
        end_column=sup.end_column + 1,
        code=code,
        name=registry()[code].NAME,
        message=message,
    )


_KNOWN: dict[str, str] | None = None


def _known_codes() -> dict[str, str]:
    global _KNOWN
    if _KNOWN is None:
        from autoport_cst.lint.rules import aliases

        _KNOWN = aliases()
    return _KNOWN


# -- sources and syntax errors ---------------------------------------------------------------


def parse(data: str | bytes, path: str = "<string>") -> tuple[cst.Module | None, Diagnostic | None]:
    """Parse a file; a syntax error (or any parser failure) is a diagnostic."""
    try:
        return cst.parse_module(data), None
    except cst.ParserSyntaxError as error:
        line, column, message = _python_syntax_error(data)
        if line is None:  # Python accepts it: a LibCST limitation
            line = getattr(error, "editor_line", None) or 1
            column = getattr(error, "editor_column", None) or 1
            message = "LibCST cannot parse this file: " + (
                getattr(error, "message", None) or str(error).splitlines()[0]
            )
        return None, _syntax_error(path, f"syntax error: {message}", line, column)
    except (UnicodeDecodeError, LookupError) as error:
        return None, _syntax_error(path, f"cannot decode the file: {error}")
    except (RecursionError, MemoryError) as error:
        return None, _syntax_error(path, f"cannot parse: {type(error).__name__} (nesting too deep)")
    except Exception as error:  # the native parser reports some failures otherwise
        return None, _syntax_error(path, f"cannot parse: {type(error).__name__}: {error}")


def _syntax_error(path: str, message: str, line: int = 1, column: int = 1) -> Diagnostic:
    """The diagnostic of a file that does not parse."""
    from autoport_cst.lint.rules import registry

    return Diagnostic(
        path=path,
        line=line,
        column=column,
        end_line=line,
        end_column=column,
        code=SYNTAX_ERROR,
        name=registry()[SYNTAX_ERROR].NAME,
        message=message,
    )


def _python_syntax_error(data: str | bytes) -> tuple[int | None, int, str]:
    """Python's own position and message for a syntax error (LibCST's native
    parser reports the start of the line)."""
    import ast
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(data)
    except SyntaxError as error:
        line = error.lineno or 1
        column = error.offset or 1
        return line, max(column, 1), error.msg
    except (ValueError, RecursionError, MemoryError) as error:
        return 1, 1, str(error)
    return None, 1, ""


def lint_source(
    code: str | bytes,
    path: str = "<string>",
    *,
    settings: LintSettings | None = None,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    module: cst.Module | None = None,
) -> list[Diagnostic]:
    """Lint one file's text and return its positioned diagnostics, sorted by
    position. ``select`` / ``ignore`` take codes, prefixes or rule names;
    ``options`` maps a rule code to its options. No configuration file is
    read: pass ``settings`` (see :func:`autoport_cst.lint.load_settings`) for
    that. A syntax error is returned as an NRN999 diagnostic. ``module``: the
    text already parsed (its code is ``code``), not parsed again."""
    settings = settings or LintSettings()
    if select is not None or ignore is not None:
        settings = settings.with_cli(list(select or []) or None, list(ignore or []) or None)
    if options:
        from autoport_cst.lint.config import parse_table

        checked = parse_table({"lint": {"options": {k: dict(v) for k, v in options.items()}}}, "<options>")
        merged = {**settings.options, **checked.options}
        settings = dataclasses.replace(settings, options=merged)
    if module is None:
        module, error = parse(code, path)
        if error is not None:
            return [error]
    assert module is not None  # parse returns a module or a diagnostic
    return lint_module(module, path, settings, source=source_text(code, module))


def source_text(code: str | bytes, module: cst.Module) -> str:
    """The text of a parsed file (bytes decoded as LibCST decoded them)."""
    if isinstance(code, str):
        return code
    try:
        text = code.decode(module.encoding)
    except (UnicodeDecodeError, LookupError):  # pragma: no cover - LibCST decoded it
        return module.code
    return text[1:] if text.startswith("\ufeff") else text
