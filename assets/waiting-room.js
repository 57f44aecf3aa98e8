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

  // The sale's opening, counted down against the server's clock: `skew` is the server's
  // `Date` header minus the browser's clock at the last answer (a buyer's clock may be
  // minutes off; the header's one-second resolution is the countdown's).
  var skew = 0, opensAt = null, countdown = null, countdownText = null;
  function duration(seconds) {
    var h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    var parts = [];
    if (h) parts.push(T.hours.replace("{n}", String(h)));
    if (h || m) parts.push(T.minutes.replace("{n}", String(m)));
    if (!h) parts.push(T.seconds.replace("{n}", String(s)));
    return parts.join(" ");
  }
  function clock(ms) {
    return new Date(ms).toLocaleTimeString(document.documentElement.lang, { hour: "2-digit", minute: "2-digit" });
  }
  function showCountdown() {
    if (opensAt === null) return;
    var left = Math.max(0, Math.ceil((opensAt - (Date.now() + skew)) / 1000));
    $("vq-eta").textContent = duration(left);
    say(countdownText.replace("{t}", duration(left)).replace("{at}", clock(opensAt)));
  }
  function opening(b) {
    opensAt = Date.parse(b.opensAt);
    root.setAttribute("data-vq-opens-at", b.opensAt);
    countdownText = b.status === "PRE_QUEUE" ? T.prequeue : T.scheduled;
    showCountdown();
    if (countdown === null) countdown = setInterval(showCountdown, 1000);
  }
  function stopCountdown() {
    if (countdown !== null) clearInterval(countdown);
    countdown = null;
    opensAt = null;
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
    // Visitor mode: the cookie vq set with this page names the visitor; no X-User-Id.
    var headers = cfg.visitor ? {} : { "X-User-Id": String(cfg.user) };
    return fetch(api + path, { method: method, headers: headers, cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        var date = Date.parse(r.headers.get("Date") || "");
        if (!isNaN(date)) skew = date - Date.now();
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
    stopCountdown();
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
    stopCountdown();
    state("WAITING", b.position);
    if (firstAhead === null) firstAhead = b.aheadCount;
    $("vq-position").textContent = String(b.position);
    $("vq-ahead").textContent = String(b.aheadCount);
    // Paused: nobody is admitted until the resume, so no estimate (etaSeconds is null).
    $("vq-eta").textContent = b.paused || b.etaSeconds == null ? "–" : eta(b.etaSeconds);
    progress((firstAhead - b.aheadCount + 1) / (firstAhead + 1));
    say(b.paused ? T.paused : T.waiting);
  }

  function run(entered) {
    var request = entered ? call("GET", "/entries/me") : call("POST", "/entries");
    return request.then(function (r) {
      if (r.status === 503 && r.body && (r.body.code === "OVERLOADED" || r.body.code === "QUEUE_UNAVAILABLE")) {
        // Busy, or holding everyone while its Redis is back: retry when told, spread out.
        say(T.busy);
        return pause((r.retryAfter || 1) * 1000 + Math.random() * 1000).then(function () { return run(entered); });
      }
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
      else if (b.status === "CLOSED") {
        stopCountdown();
        state("CLOSED", null);
        $("vq-eta").textContent = "–";
        say(b.message || T.closed);
        return null;
      } else if (b.status === "PRE_QUEUE" || b.status === "SCHEDULED") {
        state(b.status, null);
        opening(b);
      } else { state(b.status, b.position); say(b.message || b.status); }
      if (b.status === "SCHEDULED") {
        // Not recorded yet: enter again once the pre-queue opens (at most a minute from now,
        // so a changed schedule is seen), spread over two seconds so that pages do not all
        // enter in the same millisecond.
        var until = Date.parse(b.prequeueOpensAt || b.opensAt) - (Date.now() + skew);
        var wait = Math.min(60000, Math.max(1000, isNaN(until) ? 5000 : until)) + Math.random() * 2000;
        return pause(wait).then(function () { return run(false); });
      }
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
