// loopwright dashboard: live updates and small conveniences. No framework, no build step.
// Everything inserted comes from the server already escaped (views.py); text set here uses textContent.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-live");
  var dot = document.getElementById("live");
  var KEY = "loopwright-dashboard-token";

  // The printed URL carries the token in its #fragment (never sent to a server). Keep it in this origin's
  // storage and take it out of the address bar and history.
  var m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    try { localStorage.setItem(KEY, decodeURIComponent(m[1])); } catch (e) { /* storage off: no decisions */ }
    history.replaceState(null, "", location.pathname + location.search);
  }
  function token() {
    try { return localStorage.getItem(KEY) || ""; } catch (e) { return ""; }
  }
  function showTokenHint() {
    var hints = document.querySelectorAll(".no-token");
    for (var i = 0; i < hints.length; i++) hints[i].hidden = !!token();
  }
  // a decision form carries the token; the server refuses one without it
  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    if (f && f.classList && f.classList.contains("decide") && f.elements.token) f.elements.token.value = token();
  }, true);

  function setLive(state) {
    if (!dot) return;
    dot.className = "live " + state;
    dot.textContent = state === "on" ? "live" : state === "off" ? "reconnecting" : "";
  }

  function applyFilters() {
    var sel = document.getElementById("f-verdict"), txt = document.getElementById("f-text");
    var table = document.getElementById("exp-table");
    if (!table) return;
    var v = sel ? sel.value : "", q = txt ? txt.value.toLowerCase() : "";
    var rows = table.tBodies[0].rows;
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i];
      var ok = (!v || r.getAttribute("data-verdict") === v) && (!q || r.textContent.toLowerCase().indexOf(q) >= 0);
      r.hidden = !ok;
    }
  }

  function wireFilters() {
    var sel = document.getElementById("f-verdict"), txt = document.getElementById("f-text");
    if (sel) sel.addEventListener("change", applyFilters);
    if (txt) txt.addEventListener("input", applyFilters);
  }

  function wireTip() {
    var svg = document.getElementById("progress"), tip = document.getElementById("tip");
    if (!svg || !tip) return;
    svg.addEventListener("mouseover", function (ev) {
      var t = ev.target;
      if (!t.getAttribute || !t.getAttribute("data-label")) return;
      tip.textContent = t.getAttribute("data-label");
      tip.hidden = false;
    });
    svg.addEventListener("mouseout", function () { tip.hidden = true; });
  }

  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (reply) {
        var parts = reply.parts;
        if (reply.version) body.setAttribute("data-version", reply.version);
        Object.keys(parts).forEach(function (id) {
          var el = document.getElementById(id);
          if (!el || el.getAttribute("data-html") === parts[id]) return;
          // keep what the person is typing: a decision form being filled is not replaced under them
          var active = document.activeElement;
          if (active && el.contains(active) && active.tagName === "INPUT" && active.value) return;
          var sel = document.getElementById("f-verdict"), txt = document.getElementById("f-text");
          var keep = id === "experiments" ? [sel ? sel.value : "", txt ? txt.value : ""] : null;
          el.innerHTML = parts[id];
          el.setAttribute("data-html", parts[id]);
          if (keep) {
            var s2 = document.getElementById("f-verdict"), t2 = document.getElementById("f-text");
            if (s2) s2.value = keep[0];
            if (t2) t2.value = keep[1];
            wireFilters();
            applyFilters();
          }
          if (id === "chart") wireTip();
          if (id === "approvals") showTokenHint();
        });
        body.setAttribute("data-updated", String(Date.now()));
      })
      .catch(function () { setLive("off"); })
      .then(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  wireFilters();
  wireTip();
  showTokenHint();
  if (!url || !window.EventSource) return;
  var es = new EventSource("/events");
  es.addEventListener("open", function () { setLive("on"); });
  es.addEventListener("error", function () { setLive("off"); });
  var index = body.getAttribute("data-index");
  es.addEventListener("change", function (ev) {
    setLive("on");
    var versions = JSON.parse(ev.data);
    // a workspace page refreshes when its own ledger moved past what it shows; the list on any change
    if (index === null || (index in versions && versions[index] !== body.getAttribute("data-version"))) refresh();
  });
})();
