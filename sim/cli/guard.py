"""The last line of both command lines (`kvsim`, `hwprobe`): no exception reaches the user as a traceback.

Bad input (ConfigError) is one line `<tool>: <file>: <field>: <what>` and exit 2; an interrupt is one
line and exit 130; anything else is a bug, said in one line that points to `--debug` (or
KVTIER_DEBUG=1), which shows the traceback instead; exit 1.

SIGTERM (what containers, schedulers and Ray send to stop a process) is an interrupt exactly as
SIGINT (Ctrl-C) is: while a command runs, it raises KeyboardInterrupt in the main thread, so the
same paths keep finished work, hold off half-written files (`sim.outputs.atomic.signals_held`
blocks both), end worker processes and say one line.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from contextlib import contextmanager

import click
import typer

from sim.inputs.errors import EXIT_BAD_INPUT, ConfigError

EXIT_INTERNAL_ERROR = 1
EXIT_INTERRUPTED = 130
DEBUG_ENV = "KVTIER_DEBUG"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _terminate_as_interrupt(signum, frame):
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt, as SIGINT does


@contextmanager
def sigterm_as_interrupt():
    """While the block runs (in the main thread), SIGTERM raises KeyboardInterrupt; then the
    handler before it is back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class GuardedTyper(typer.Typer):
    """A Typer app whose every command runs inside `guard`, with a global --debug option."""

    def __init__(self, prog: str, **kwargs):
        super().__init__(**kwargs)
        self.prog = prog
        self.debug = False
        self._interrupt_reported = False

        @self.callback()
        def _options(debug: bool = typer.Option(False, "--debug", help="on an internal error, show the traceback")):
            self.debug = debug

    def __call__(self, *args, **kwargs):
        """An interrupt while typer builds the command line (before any command runs): one line too.
        Typer itself turns one during argument parsing into a silent exit 130, so that exit is
        reported here unless `guard` already said it."""
        self._interrupt_reported = False
        try:
            with sigterm_as_interrupt():
                return super().__call__(*args, **kwargs)
        except KeyboardInterrupt:
            print(f"{self.prog}: interrupted", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        except SystemExit as done:
            if done.code == EXIT_INTERRUPTED and not self._interrupt_reported:
                print(f"{self.prog}: interrupted", file=sys.stderr)
            raise

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)

        def decorator(fn):
            @functools.wraps(fn)
            def guarded(*a, **kw):
                return self.guard(fn, *a, **kw)

            register(guarded)
            return fn

        return decorator

    def guard(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except ConfigError as err:
            print(f"{self.prog}: {err.line()}", file=sys.stderr)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            print(f"{self.prog}: interrupted", file=sys.stderr)
            self._interrupt_reported = True
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as err:  # noqa: BLE001 - the one place every other error ends
            if self.debug or os.environ.get(DEBUG_ENV):
                raise
            print(f"{self.prog}: internal error: {_first_line(err)} (run with --debug for the traceback)",
                  file=sys.stderr)
            raise typer.Exit(EXIT_INTERNAL_ERROR) from None
