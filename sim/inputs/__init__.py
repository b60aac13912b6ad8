"""What a run is asked: reading files (regular files only) under size and depth limits, the scenario
schema and its checks, length draws and served requests, the cost of work estimated before it starts
(`cost`), Hugging Face `config.json`, measured profiles and the datasheet catalogs
(`sim/catalog/*.yaml`), and the one error type for bad input. Imports only `sim.model`."""
