"""`kvsim report`: one self-contained interactive HTML page (plotly.js inline).

Modules, one concept each: `figures_*` (plotly figures), `selectable` (figures that follow the page's
selectors), `summary_text` (the written summary), `validation_table` / `plan_input` (reading
`hwprobe validate` CSVs and `kvsim plan` folders back), `accuracy_section` (the committed accuracy
bands as a table), `html` / `document` (the page), `progress`,
`command`. Imports `sim.studies`, `sim.plan`, `sim.decode` and the layers below them.
"""
