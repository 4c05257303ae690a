// Simulation page: poll a running run's progress into the bar (reload when it ends), draw the charts.
(function () {
  "use strict";
  function poll(box) {
    var url = box.dataset.url;
    var every = parseInt(box.dataset.pollMs, 10) || 1000;
    var bar = document.getElementById("progress-bar");
    var text = document.getElementById("progress-text");
    function tick() {
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { return r.json(); })
        .then(function (s) {
          bar.value = s.progress;
          text.textContent = s.jobs_done + "/" + s.jobs_total + " jobs replayed";
          if (s.status === "done" || s.status === "failed") { window.location.reload(); return; }
          setTimeout(tick, every);
        })
        .catch(function () { setTimeout(tick, every * 2); });
    }
    setTimeout(tick, every);
  }
  function draw() {
    var data = document.getElementById("simulation-figures");
    if (!data || !window.Plotly) { return; }
    var figs = JSON.parse(data.textContent);
    Object.keys(figs).forEach(function (name) {
      var el = document.getElementById("chart-" + name);
      if (el) { window.Plotly.newPlot(el, figs[name].data, figs[name].layout, { responsive: true }); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("simulation-progress");
    if (box) { poll(box); }
    draw();
  });
})();
