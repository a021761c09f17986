// renderqueue console: refresh the page's data without reloading it. Every element with
// data-fragment and an id is replaced by the fragment of the same id that the server renders for
// GET <this page>?format=fragments. Nothing else is fetched; no library is used.
(function () {
  "use strict";
  var status = document.getElementById("refresh-status");
  if (!status || !status.dataset.refresh) return;
  var every = parseInt(status.dataset.refresh, 10);
  if (!(every > 0)) return;
  var url = window.location.pathname + "?format=fragments";

  function show(text, bad) {
    status.textContent = text;
    status.classList.toggle("bad", !!bad);
  }

  function clockOf(iso) {
    var d = new Date(iso);
    return isNaN(d) ? iso : d.toISOString().substring(11, 19) + "Z";
  }

  function tick() {
    if (document.hidden) { setTimeout(tick, every); return; }
    fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        return r.json().then(function (body) { return { ok: r.ok, status: r.status, body: body }; },
          function () { return { ok: false, status: r.status, body: {} }; });
      })
      .then(function (res) {
        if (!res.ok) {
          show("refresh failed (HTTP " + res.status + (res.body.error ? ": " + res.body.error : "") + "); the figures below are older", true);
          return;
        }
        var frags = res.body.fragments || {};
        Object.keys(frags).forEach(function (id) {
          var el = document.getElementById(id);
          if (el && el.hasAttribute("data-fragment")) el.innerHTML = frags[id];
        });
        show("as of " + clockOf(res.body.now), false);
        document.documentElement.dataset.refreshed = String((parseInt(document.documentElement.dataset.refreshed || "0", 10) + 1));
      })
      .catch(function (e) { show("refresh failed (" + e + "); the figures below are older", true); })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
