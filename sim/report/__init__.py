"""`kvsim report`: one self-contained interactive HTML page (plotly.js inline).

Modules, one concept each: `grid` (the projection sweep), `paper_claims` / `paper_check` (the
reference paper's numbers beside correct ones), `validation_table` (reading `hwprobe validate`
CSVs), `figures_*` (plotly figures), `selectable` (figures that follow the page's selectors),
`summary_text` (the written summary), `html` / `document` (the page), `progress`, `command`.
"""
