// Draws the Plotly charts a page embeds as JSON: {"name": figure} into elements #chart-name,
// in the page's colours (the CSS variables of the light or dark theme), redrawn when it changes.
(function () {
  "use strict";
  const source = document.getElementById("job-charts");
  if (!source) return;
  const charts = JSON.parse(source.textContent);
  const config = { responsive: true, displaylogo: false };
  function theme() {
    const css = getComputedStyle(document.documentElement);
    const v = function (name) { return css.getPropertyValue(name).trim(); };
    return {
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      "font.color": v("--fg"),
      "xaxis.gridcolor": v("--border"),
      "yaxis.gridcolor": v("--border"),
    };
  }
  const drawn = [];
  Object.keys(charts).forEach(function (name) {
    const el = document.getElementById("chart-" + name);
    if (!el) return;
    Plotly.newPlot(el, charts[name].data, charts[name].layout, config).then(function () {
      return Plotly.relayout(el, theme());
    }).then(function () {
      drawn.push(el);
      el.dataset.rendered = "1";
    });
  });
  const scheme = window.matchMedia("(prefers-color-scheme: dark)");
  scheme.addEventListener("change", function () {
    const colours = theme();
    drawn.forEach(function (el) { Plotly.relayout(el, colours); });
  });
})();
