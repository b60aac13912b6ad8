"""How well a GPU's fitted datasheet constants carry over to a sibling (not a test;
sim/studies/sibling_fits.py): each target GPU's held-out kernel measurements predicted with its own
fit, with another GPU's, and with the flat defaults.

    .venv/bin/python benchmarks/sibling_fits.py

Median |error| per pair and operator family. Needs the `.[measured]` extra. These are operator
measurements from NVIDIA's harness, not this machine: nothing here is timed.
"""

from __future__ import annotations

import pandas as pd

from sim.studies.sibling_fits import transfer_summary


def main() -> None:
    table = transfer_summary()
    for col in ("own", "sibling", "flat"):
        table[col] = (100 * table[col]).map(lambda v: f"{v:.1f}%")
    pd.set_option("display.width", 200)
    print(table.drop(columns="relation").to_string(index=False))
    print()
    for (target, sibling), rel in table.groupby(["target", "fit of"], sort=False)["relation"].first().items():
        print(f"{target} with {sibling}'s fit: {rel}")


if __name__ == "__main__":
    main()
