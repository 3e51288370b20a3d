"""Declaring a tool: ``@tool`` on a function, and what the model is told of it.

The function's name, the first paragraph of its docstring and its annotated parameters are
the tool's whole description. The parameters become one msgspec ``Struct`` (unknown fields
refused), which gives both the JSON schema sent upstream and the validation of the arguments
the model sends back, into the very types the function declares: a schema and a check that
cannot disagree. A parameter's own description goes in its annotation:
``Annotated[int, msgspec.Meta(description="...")]``.

msgspec's schema for a Struct is a ``$ref`` into ``$defs``; providers want an object schema
at the root and do not all follow references, so every reference is inlined (a recursive
type, which cannot be, is refused when the tool is declared).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import msgspec

from ..exceptions import ChatstreamError

# What providers accept as a function's name (OpenAI's rule; the others' are looser).
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_TIMEOUT = 30.0


class ToolError(ChatstreamError):
    """Raised by a tool, with a sentence the model may read (what went wrong, what to try)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ArgumentsInvalid(ChatstreamError):
    """The model's arguments for a call are not JSON, or do not match the tool's parameters;
    the message says how, for the model to read."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know of the call it serves: give a parameter this annotation.

    ``call`` is the call's row: its ``id`` is the key to make a side effect happen once (the
    provider's ``call_id`` may be empty, or repeated).
    """

    user: Any
    conversation: Any
    generation: Any
    call: Any


class Tool:
    """A function the model may call, as ``@tool`` made it. Calling it calls the function."""

    def __init__(self, func: Callable[..., Any], *,
                 needs_approval: bool | Callable[..., Any] = False,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        name = getattr(func, "__name__", "")
        where = f"@tool {getattr(func, '__module__', '?')}.{name}"
        if not NAME.fullmatch(name):
            raise TypeError(f"{where}: a tool's name must be 1 to 64 letters, digits, _ or -.")
        if type(needs_approval) is not bool and not callable(needs_approval):
            raise TypeError(f"{where}: needs_approval must be True, False or a callable, not "
                            f"{needs_approval!r}.")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise TypeError(f"{where}: timeout must be a positive number of seconds, not "
                            f"{timeout!r}.")
        self.func = func
        self.name = name
        self.description = _first_paragraph(inspect.getdoc(func) or "")
        self.needs_approval = needs_approval
        self.timeout = float(timeout)
        self.is_async = inspect.iscoroutinefunction(func)
        self.arguments, self.context_parameter = _arguments_of(func, where)
        self.parameters = _inline(msgspec.json.schema(self.arguments), where)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"

    def spec(self) -> dict[str, Any]:
        """The tool as the request's ``tools`` list gives it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def parse(self, arguments: str) -> dict[str, Any]:
        """The keyword arguments in the model's ``arguments`` (JSON text), in the types the
        function declares; :class:`ArgumentsInvalid` says what is wrong."""
        try:
            values = msgspec.json.decode(arguments.strip() or "{}", type=self.arguments)
        except msgspec.ValidationError as error:
            raise ArgumentsInvalid(f"The arguments do not match the tool's parameters: "
                                   f"{error}.") from None
        except msgspec.DecodeError:
            raise ArgumentsInvalid("The arguments are not a JSON object.") from None
        return {field: getattr(values, field) for field in self.arguments.__struct_fields__}


@overload
def tool(func: Callable[..., Any], /) -> Tool: ...


@overload
def tool(*, needs_approval: bool | Callable[..., Any] = False,
         timeout: float = DEFAULT_TIMEOUT) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(func: Callable[..., Any] | None = None, /, *,
         needs_approval: bool | Callable[..., Any] = False,
         timeout: float = DEFAULT_TIMEOUT) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make ``func`` (sync or async) a tool the model may call: ``@tool``, or
    ``@tool(needs_approval=True, timeout=10)``."""
    if func is not None:
        return Tool(func)

    def declare(func: Callable[..., Any]) -> Tool:
        return Tool(func, needs_approval=needs_approval, timeout=timeout)

    return declare


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())


def _arguments_of(func: Callable[..., Any], where: str) -> tuple[type[msgspec.Struct], str | None]:
    """The Struct of ``func``'s parameters, and the name of its ToolContext one (if any)."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as error:
        raise TypeError(f"{where}: its annotations cannot be resolved ({error}).") from None
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    context = None
    for parameter in inspect.signature(func).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD,
                              parameter.POSITIONAL_ONLY):
            raise TypeError(f"{where}: parameter {parameter.name!r} must be one that can be "
                            "passed by name (not *args, **kwargs or positional-only).")
        if parameter.name not in hints:
            raise TypeError(f"{where}: parameter {parameter.name!r} has no annotation; the "
                            "model is told each parameter's type.")
        annotation = hints[parameter.name]
        if annotation is ToolContext:
            context = parameter.name
        elif parameter.default is parameter.empty:
            fields.append((parameter.name, annotation))
        else:
            fields.append((parameter.name, annotation, parameter.default))
    try:
        struct = msgspec.defstruct(getattr(func, "__name__", "arguments"), fields,
                                   kw_only=True, forbid_unknown_fields=True)
        msgspec.json.schema(struct)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{where}: its parameters cannot be described to the model "
                        f"({error}).") from None
    return struct, context


def _inline(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """``schema`` with every ``$ref`` replaced by what it refers to, and no ``$defs``."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name in seen:
                raise TypeError(f"{where}: parameter type {name} refers to itself, which a "
                                "schema without references cannot describe.")
            target = {key: value for key, value in definitions[name].items() if key != "title"}
            return resolve(target, (*seen, name))
        return {key: resolve(value, seen) for key, value in node.items()}

    root = resolve({"$ref": schema["$ref"]}, ())
    root.setdefault("properties", {})
    if not root.get("required"):  # JSON Schema drafts before 6 refuse an empty list
        root.pop("required", None)
    root["additionalProperties"] = False
    return dict(root)
