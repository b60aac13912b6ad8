"""HTML building blocks of the report: one self-contained page, plotly.js inline (no network).

Figures are rendered with plotly's own `to_html` (fixed div ids, so the same data gives the same
bytes). Selector-driven figures carry their variants in a JSON script tag; a short script calls
`Plotly.update` on them when a selector changes.
"""

from __future__ import annotations

import html
import json

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from .selectable import Dimension, SelectableFigure

PLOT_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 0 24px 48px; color: #222; line-height: 1.45; }
h1 { margin: 24px 0 4px; } h2 { margin-top: 40px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #666; font-size: 13px; }
.summary { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 8px 20px; }
.summary li { margin: 6px 0; }
.controls { position: sticky; top: 0; z-index: 10; background: #fff; border-bottom: 1px solid #ddd; padding: 10px 0;
            display: flex; gap: 18px; flex-wrap: wrap; }
.controls label { font-size: 13px; color: #444; } .controls select { margin-left: 6px; font-size: 14px; }
.figure { margin: 18px 0 8px; } .caption { color: #555; font-size: 13px; margin: 0 0 18px; }
table.data { border-collapse: collapse; font-size: 13px; margin: 12px 0; }
table.data th, table.data td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
table.data th { background: #f6f8fa; }
nav.toc { font-size: 14px; margin: 12px 0; } nav.toc ol { margin: 4px 0; padding-left: 22px; columns: 2; }
"""

SELECTOR_JS = """
(function () {
  var stores = {};
  function selection() {
    var s = {};
    document.querySelectorAll('select[data-dim]').forEach(function (el) { s[el.dataset.dim] = el.value; });
    return s;
  }
  function apply() {
    var sel = selection();
    document.querySelectorAll('div[data-variants]').forEach(function (box) {
      var id = box.dataset.variants;
      if (!stores[id]) { stores[id] = JSON.parse(document.getElementById(id).textContent); }
      var key = box.dataset.dims.split(',').map(function (d) { return sel[d]; }).join('|');
      var v = stores[id][key];
      var plot = document.getElementById(box.dataset.fig);
      if (v && plot) { Plotly.update(plot, v.data, v.layout); }
    });
  }
  document.querySelectorAll('select[data-dim]').forEach(function (el) { el.addEventListener('change', apply); });
})();
"""


def esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _json_for_script(data) -> str:
    """JSON safe inside a <script> element (no '</' can close it)."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")


def figure_html(fig_id: str, fig: go.Figure, caption: str = "") -> str:
    div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=fig_id, config=PLOT_CONFIG)
    cap = f'<p class="caption">{esc(caption)}</p>' if caption else ""
    return f'<div class="figure">{div}</div>{cap}'


def selectable_html(sf: SelectableFigure) -> str:
    store_id = f"variants-{sf.fig_id}"
    div = pio.to_html(sf.figure, full_html=False, include_plotlyjs=False, div_id=sf.fig_id, config=PLOT_CONFIG)
    cap = f'<p class="caption">{esc(sf.caption)}</p>' if sf.caption else ""
    return (f'<div class="figure" data-fig="{esc(sf.fig_id)}" data-dims="{esc(",".join(sf.dims))}" '
            f'data-variants="{esc(store_id)}">{div}</div>{cap}'
            f'<script type="application/json" id="{esc(store_id)}">{_json_for_script(sf.variants)}</script>')


def controls_html(dims: list[Dimension]) -> str:
    parts = []
    for d in dims:
        opts = "".join(f'<option value="{esc(v)}"{" selected" if v == d.default else ""}>{esc(lbl)}</option>' for v, lbl in d.options)
        parts.append(f'<label>{esc(d.label)}<select data-dim="{esc(d.name)}">{opts}</select></label>')
    return f'<div class="controls">{"".join(parts)}</div>'


def table_html(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def paragraph(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def summary_html(items: list[str]) -> str:
    lis = "".join(f"<li>{esc(i)}</li>" for i in items)
    return f'<div class="summary" id="summary"><h3>What the figures say</h3><ul>{lis}</ul></div>'


def toc_html(entries: list[tuple[str, str]]) -> str:
    """The page's table of contents: a link to each (section id, title)."""
    items = "".join(f'<li><a href="#{esc(sid)}">{esc(title)}</a></li>' for sid, title in entries)
    return f'<nav class="toc" id="contents"><h3>Contents</h3><ol>{items}</ol></nav>'


def section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, meta: str, body: str) -> str:
    """The whole document: plotly.js inline in <head> (what include_plotlyjs=True embeds)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<style>{CSS}</style><script type="text/javascript">{get_plotlyjs()}</script></head>'
            f'<body><h1>{esc(title)}</h1><p class="meta">{esc(meta)}</p>{body}'
            f'<script type="text/javascript">{SELECTOR_JS}</script></body></html>\n')
