// The waiting page's client: enters, polls as the server says, shows the place, and sends
// the buyer on when admitted. No framework; state is on #vq-root as data-vq-status and
// data-vq-position for tests and embedding apps.
(function () {
  "use strict";
  var cfg = JSON.parse(document.getElementById("vq-config").textContent);
  var T = cfg.text;
  var root = document.getElementById("vq-root");
  var api = "/virtual-queues/" + cfg.type + "/" + cfg.id;
  var firstAhead = null;
  var backoff = 1;

  function $(id) { return document.getElementById(id); }
  function say(text) { $("vq-message").textContent = text; }
  function state(status, position) {
    root.setAttribute("data-vq-status", status);
    root.setAttribute("data-vq-position", position == null ? "" : String(position));
  }
  function progress(share) {
    var pct = Math.max(0, Math.min(100, Math.round(share * 100)));
    $("vq-progress").style.width = pct + "%";
    root.querySelector(".bar").setAttribute("aria-valuenow", String(pct));
  }
  function eta(seconds) {
    if (seconds < 60) return T.etaUnderMinute;
    return T.etaMinutes.replace("{n}", String(Math.round(seconds / 60)));
  }

  // Timers run in a worker: browsers throttle the page's own timers in background tabs to
  // about once a minute, not a worker's. A tab coming back to the front polls at once.
  var worker = null, waits = {}, next = 0, wake = null;
  try {
    var src = "onmessage=function(e){setTimeout(function(){postMessage(e.data.id)},e.data.ms)}";
    worker = new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
    worker.onmessage = function (e) { var f = waits[e.data]; delete waits[e.data]; if (f) f(); };
  } catch (e) { worker = null; }
  function pause(ms) {
    return new Promise(function (resolve) {
      var done = function () { if (wake === done) wake = null; resolve(); };
      wake = done;
      if (worker) { var id = ++next; waits[id] = done; worker.postMessage({ id: id, ms: ms }); }
      else setTimeout(done, ms);
    });
  }
  document.addEventListener("visibilitychange", function () { if (!document.hidden && wake) wake(); });

  function call(method, path) {
    return fetch(api + path, { method: method, headers: { "X-User-Id": String(cfg.user) }, cache: "no-store" })
      .then(function (r) {
        var retry = Number(r.headers.get("Retry-After")) || null;
        return r.json().catch(function () { return null; })
          .then(function (body) { return { status: r.status, retryAfter: retry, body: body }; });
      });
  }

  function fill(template, token) {
    var values = { type: cfg.type, id: cfg.id, user: cfg.user, token: token };
    return template.replace(/\{(type|id|user|token)\}/g, function (_, k) { return encodeURIComponent(String(values[k])); });
  }

  function admitted(body) {
    state(body.status, null);
    progress(1);
    $("vq-ahead").textContent = "0";
    $("vq-eta").textContent = "–";
    say(T.admitted);
    var detail = { status: body.status, token: body.entryToken, expiresAt: body.tokenExpiresAt };
    root.dispatchEvent(new CustomEvent("vq:admitted", { detail: detail, bubbles: true }));
    if (cfg.embedOrigin && window.parent !== window) {
      window.parent.postMessage({ type: "vq:admitted", status: detail.status, token: detail.token, expiresAt: detail.expiresAt }, cfg.embedOrigin);
    }
    if (cfg.returnUrl) location.assign(fill(cfg.returnUrl, body.entryToken));
    else $("vq-token").textContent = body.entryToken;
  }

  function waiting(b) {
    state("WAITING", b.position);
    if (firstAhead === null) firstAhead = b.aheadCount;
    $("vq-position").textContent = String(b.position);
    $("vq-ahead").textContent = String(b.aheadCount);
    $("vq-eta").textContent = eta(b.etaSeconds);
    progress((firstAhead - b.aheadCount + 1) / (firstAhead + 1));
    say(T.waiting);
  }

  function run(entered) {
    var request = entered ? call("GET", "/entries/me") : call("POST", "/entries");
    return request.then(function (r) {
      if (r.status >= 500 || !r.body) throw new Error("no answer");
      backoff = 1;
      if (r.status === 429) {
        state("QUEUE_FULL", null);
        say(T.full);
        return pause((r.retryAfter || 5) * 1000).then(function () { return run(false); });
      }
      if (r.status === 404) { say(T.reentering); return run(false); }
      if (r.status !== 200) { state("ERROR", null); say(r.body.detail || T.offline); return null; }
      var b = r.body;
      if (b.status === "ADMITTED" || b.status === "DIRECT_ADMITTED") { admitted(b); return null; }
      if (b.status === "WAITING") waiting(b);
      else { state(b.status, b.position); say(b.message || b.status); if (b.status === "CLOSED") return null; }
      return pause((b.pollAfterSeconds || 5) * 1000).then(function () { return run(true); });
    }).catch(function () {
      state(root.getAttribute("data-vq-status") || "OFFLINE", null);
      say(T.offline.replace("{n}", String(backoff)));
      var wait = backoff;
      backoff = Math.min(backoff * 2, 30);
      return pause(wait * 1000).then(function () { return run(entered); });
    });
  }

  say(T.entering);
  run(false);
})();
