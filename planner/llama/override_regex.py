"""`-ot` patterns checked before anything matches them: bounded in length and nesting, free of
nested quantifiers, and quick to match a tensor name.

Python's `re` has no timeout, and llama.cpp's std::regex (ECMAScript, a backtracking matcher:
llama-model.cpp searches every tensor name with each override's std::regex) backtracks on the same
patterns: `(.*)*x` or `.*.*.*.*.*.*.*.*y` take exponential or high-polynomial time on a name that
does not match, and 5,000 nested groups overflow both matchers' recursion. So such a pattern is
refused at parse, with the reason, rather than hanging fitplan or being handed to llama.cpp.
"""
from __future__ import annotations

import re
import signal
import threading
import time
import warnings
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from planner.core.errors import FlagError
from planner.core.units import quote

MAX_PATTERN_CHARS = 4096   # the longest -ot pattern taken: a 100-layer alternation is ~500
MAX_GROUP_DEPTH = 32       # nested groups; std::regex and sre_parse recurse once per level
# ggml.h GGML_MAX_NAME = 64: a tensor name has at most 63 characters, so a probe of that length is
# the longest subject llama.cpp ever searches.
GGML_MAX_NAME = 64
# A pattern may take this long on one probe name; real ones take microseconds, and llama.cpp
# matches each pattern against every one of a model's (up to thousands of) tensor names.
PROBE_SECONDS = 0.02
_PROBES = ("blk.0.ffn_up_exps.weight", "token_embd.weight", "output_norm.weight",
           "blk.511.ffn_gate_up_chexps.weight", "a" * (GGML_MAX_NAME - 1), "0" * (GGML_MAX_NAME - 1),
           "." * (GGML_MAX_NAME - 1), ("blk.12.ffn_down_exps." * 4)[:GGML_MAX_NAME - 1])
_LLAMA_TOO = "llama.cpp's std::regex backtracks the same way and would hang loading the model"
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, getattr(sre_constants, "POSSESSIVE_REPEAT", None))


def check_override_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled pattern, or FlagError saying why it is refused."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FlagError(f"-ot: a pattern of {len(pattern)} characters; expected at most {MAX_PATTERN_CHARS}")
    depth = _group_depth(pattern)
    if depth > MAX_GROUP_DEPTH:
        raise FlagError(f"-ot: groups nested {depth} deep in {quote(pattern)}; expected at most {MAX_GROUP_DEPTH} "
                        f"(llama.cpp's std::regex recurses once per level and overflows its stack)")
    try:
        with warnings.catch_warnings():
            # 'Possible nested set' and the like: a note about future Python versions, not the user's error
            warnings.simplefilter("ignore", FutureWarning)
            parsed = sre_parse.parse(pattern)
            compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise FlagError(f"-ot: bad regular expression {quote(pattern)}: {quote(str(e), 120)}") from None
    if _nested_repeat(parsed.data, inside=False):
        raise FlagError(f"-ot: {quote(pattern)} repeats a repetition (a nested quantifier such as (.*)*): "
                        f"matching it takes exponential time; {_LLAMA_TOO}")
    _probe(compiled)
    return compiled


def _group_depth(pattern: str) -> int:
    """The deepest nesting of ( ... ), skipping escapes and character classes."""
    depth = deepest = 0
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed item (sre_parse's shapes per opcode)."""
    if op is sre_constants.SUBPATTERN:
        return [av[3]]
    if op is sre_constants.BRANCH:
        return list(av[1])
    if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        return [av[1]]
    if op is getattr(sre_constants, "ATOMIC_GROUP", None):
        return [av]
    if op is sre_constants.GROUPREF_EXISTS:
        return [sub for sub in av[1:] if sub is not None]
    return []


def _nested_repeat(items: list[tuple[Any, Any]], inside: bool) -> bool:
    """Whether a repetition (max > 1; `?` is none) holds another one: the star height above 1
    behind catastrophic backtracking."""
    for op, av in items:
        if op in _REPEATS:
            many = bool(av[1] > 1)
            if (many and inside) or _nested_repeat(list(av[2].data), inside or many):
                return True
        elif any(_nested_repeat(list(sub.data), inside) for sub in _children(op, av)):
            return True
    return False


class _TooSlow(Exception):
    pass


def _probe(compiled: re.Pattern[str]) -> None:
    """Search a few names of up to GGML_MAX_NAME - 1 characters; refuse a pattern slower than
    PROBE_SECONDS on one. The search is stopped by a timer (re checks for signals while it
    backtracks), which only the main thread can set: elsewhere the static checks stand alone."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return

    def stop(signum: int, frame: Any) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        for name in _PROBES:
            started = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, 10 * PROBE_SECONDS)
            try:
                compiled.search(name)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if time.perf_counter() - started > PROBE_SECONDS:
                raise _TooSlow
    except _TooSlow:
        raise FlagError(f"-ot: {quote(compiled.pattern)} takes more than {PROBE_SECONDS * 1000:.0f} ms to search "
                        f"one {GGML_MAX_NAME - 1}-character tensor name (catastrophic backtracking); "
                        f"{_LLAMA_TOO}") from None
    finally:
        signal.signal(signal.SIGALRM, previous)
