// The now page: fetch the body again every few seconds while the box is ticked.
(function () {
  "use strict";
  const body = document.getElementById("now-body");
  const box = document.getElementById("now-refresh");
  if (!body) return;
  const period = 1000 * Number(body.dataset.refreshS || 15);
  let busy = false;
  function refresh() {
    if (busy || (box && !box.checked) || document.hidden) return;
    busy = true;
    fetch(body.dataset.fragmentUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null) {
          body.innerHTML = html;
          body.dataset.refreshed = String(Date.now());
        }
      })
      .catch(function () { /* the next tick tries again */ })
      .finally(function () { busy = false; });
  }
  window.setInterval(refresh, period);
})();
