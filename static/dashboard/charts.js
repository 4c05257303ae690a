// Draws the Plotly charts a page embeds as JSON: {"name": figure} into elements #chart-name.
(function () {
  "use strict";
  const source = document.getElementById("job-charts");
  if (!source) return;
  const charts = JSON.parse(source.textContent);
  const config = { responsive: true, displaylogo: false };
  Object.keys(charts).forEach(function (name) {
    const el = document.getElementById("chart-" + name);
    if (!el) return;
    Plotly.newPlot(el, charts[name].data, charts[name].layout, config).then(function () {
      el.dataset.rendered = "1";
    });
  });
})();
