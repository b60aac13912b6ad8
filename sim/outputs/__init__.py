"""What a run writes: the summary schemas, the run folder (summary.json, steps.csv, printed rows),
finite JSON, CSV text with formula cells neutralised (`csv_text`) and atomic writes with signals
held. Imports `sim.model`, `sim.inputs`, `sim.device`."""
