// Queue page: reload the table in place every few seconds while the box is ticked.
(function () {
  "use strict";
  const box = document.getElementById("queue-table");
  const toggle = document.getElementById("auto-refresh");
  const seconds = Number((document.getElementById("refresh-seconds") || {}).textContent || 10);
  if (!box || !toggle) return;
  function refresh() {
    // Not while the table holds keyboard focus: replacing it would drop the focus to the page.
    if (!toggle.checked || document.hidden || box.contains(document.activeElement)) return;
    fetch(box.dataset.fragmentUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) { box.innerHTML = html; box.dataset.refreshed = String(Date.now()); })
      .catch(function (err) { box.dataset.refreshError = String(err); });
  }
  window.setInterval(refresh, seconds * 1000);
})();
