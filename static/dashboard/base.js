// Shared page behaviour: the cluster picker and the header's search suggestions.
(function () {
  "use strict";
  // Pickers marked data-autosubmit go on a pointer choice or Enter; arrowing through the options
  // with the keyboard does not leave the page at the first step.
  document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
    let keyed = false;
    select.addEventListener("keydown", function (e) {
      keyed = e.key !== "Enter";
      if (e.key === "Enter" && select.value) { e.preventDefault(); select.form.submit(); }
    });
    select.addEventListener("pointerdown", function () { keyed = false; });
    select.addEventListener("change", function () { if (select.value && !keyed) select.form.submit(); });
  });

  // A status badge links to its glossary entry: bring the entry into view (also after the queue's
  // table was refreshed under it) and move the focus there for keyboard users.
  function showTarget() {
    const id = decodeURIComponent(window.location.hash.slice(1));
    const target = id && document.getElementById(id);
    if (!target || !target.closest(".glossary")) return;
    target.scrollIntoView({ block: "center" });
    if (!target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
    target.focus({ preventScroll: true });
  }
  window.addEventListener("hashchange", showTarget);
  showTarget();

  // Search: a combobox whose suggestions come from /search/?format=json; arrows move through
  // them, Enter opens the chosen one (or submits the query), Escape closes the list.
  const input = document.getElementById("search-q");
  const list = document.getElementById("search-suggestions");
  if (!input || !list) return;
  let items = [];
  let active = -1;
  let timer = null;
  let seq = 0;

  function close() {
    list.hidden = true;
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
    active = -1;
  }
  function mark(i) {
    active = i;
    items.forEach(function (li, k) { li.setAttribute("aria-selected", String(k === i)); });
    if (i >= 0) input.setAttribute("aria-activedescendant", items[i].id);
    else input.removeAttribute("aria-activedescendant");
  }
  function show(results) {
    list.replaceChildren();
    items = results.map(function (hit, k) {
      const li = document.createElement("li");
      li.id = "search-option-" + k;
      li.setAttribute("role", "option");
      li.setAttribute("aria-selected", "false");
      li.dataset.url = hit.url;
      const kind = document.createElement("span");
      kind.className = "kind";
      kind.textContent = hit.kind;
      li.append(kind, " ", hit.label);
      li.addEventListener("mousedown", function (e) { e.preventDefault(); window.location.assign(hit.url); });
      list.append(li);
      return li;
    });
    if (!items.length) { close(); return; }
    list.hidden = false;
    input.setAttribute("aria-expanded", "true");
    mark(-1);
  }
  function suggest() {
    const q = input.value.trim();
    if (q.length < 2) { close(); return; }
    const mine = ++seq;
    fetch(input.dataset.suggestUrl + "&q=" + encodeURIComponent(q), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : { results: [] }; })
      .then(function (body) { if (mine === seq) show(body.results.slice(0, 12)); })
      .catch(close);
  }
  input.addEventListener("input", function () { window.clearTimeout(timer); timer = window.setTimeout(suggest, 150); });
  input.addEventListener("keydown", function (e) {
    if (e.key === "ArrowDown" && items.length) {
      e.preventDefault();
      if (list.hidden) { list.hidden = false; input.setAttribute("aria-expanded", "true"); }
      mark((active + 1) % items.length);
    } else if (e.key === "ArrowUp" && items.length) {
      e.preventDefault();
      mark(active <= 0 ? items.length - 1 : active - 1);
    } else if (e.key === "Enter" && active >= 0 && !list.hidden) {
      e.preventDefault();
      window.location.assign(items[active].dataset.url);
    } else if (e.key === "Escape") {
      // Drop answers still on their way; with the list open, Escape closes it and keeps the text
      // (a search field's own Escape clears it, as it does once the list is closed).
      window.clearTimeout(timer);
      seq++;
      if (!list.hidden) { e.preventDefault(); close(); }
    }
  });
  input.addEventListener("blur", close);
})();
