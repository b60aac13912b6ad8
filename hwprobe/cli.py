"""`hwprobe` command line. Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import importlib

from sim.cli.guard import GuardedTyper

app = GuardedTyper("hwprobe", add_completion=False, no_args_is_help=True,
                   help="hwprobe: measure a machine, run the real tiered KV cache, validate the simulator against it.")

# module name -> registers one or more commands on `app` via `register(app)`
_COMMAND_MODULES = [
    "hwprobe.info_cmd",
    "hwprobe.calibrate_cmd",
    "hwprobe.exactness_cmd",
    "hwprobe.run_cmd",
    "hwprobe.validate_cmd",
]

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as exc:
        if exc.name != _name:  # a real missing dependency inside the module: surface it
            raise
        continue
    _mod.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
