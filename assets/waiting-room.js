// The waiting page's client: enters, polls as the server says, shows the place, and sends
// the buyer on when admitted. No framework; state is on #vq-root as data-vq-status and
// data-vq-position (and data-vq-lane in a target with lanes) for tests and embedding apps.
// A presale link carries its access code as ?laneCode=…: the first enter sends it; a code
// refused (wrong or used) leaves the buyer in the public lane, saying why.
(function () {
  "use strict";
  var cfg = JSON.parse(document.getElementById("vq-config").textContent);
  var T = cfg.text;
  var root = document.getElementById("vq-root");
  var api = "/virtual-queues/" + cfg.type + "/" + cfg.id;
  var firstAhead = null;
  var backoff = 1;
  var laneCode = new URLSearchParams(location.search).get("laneCode");

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

  // Proof of work (status CHALLENGE): a worker finds a nonce such that SHA-256(seed + nonce)
  // starts with `bits` zero bits, reporting how far it got; the page then enters with it.
  var SOLVER = "(function(){var K=[0x428a2f98,0x71374491,0xb5c0fbcf,0xe9b5dba5,0x3956c25b,0x59f111f1,0x923f82a4,0xab1c5ed5,0xd807aa98,0x12835b01,0x243185be,0x550c7dc3,0x72be5d74,0x80deb1fe,0x9bdc06a7,0xc19bf174,0xe49b69c1,0xefbe4786,0x0fc19dc6,0x240ca1cc,0x2de92c6f,0x4a7484aa,0x5cb0a9dc,0x76f988da,0x983e5152,0xa831c66d,0xb00327c8,0xbf597fc7,0xc6e00bf3,0xd5a79147,0x06ca6351,0x14292967,0x27b70a85,0x2e1b2138,0x4d2c6dfc,0x53380d13,0x650a7354,0x766a0abb,0x81c2c92e,0x92722c85,0xa2bfe8a1,0xa81a664b,0xc24b8b70,0xc76c51a3,0xd192e819,0xd6990624,0xf40e3585,0x106aa070,0x19a4c116,0x1e376c08,0x2748774c,0x34b0bcb5,0x391c0cb3,0x4ed8aa4a,0x5b9cca4f,0x682e6ff3,0x748f82ee,0x78a5636f,0x84c87814,0x8cc70208,0x90befffa,0xa4506ceb,0xbef9a3f7,0xc67178f2];" +
    "K=new Int32Array(K);var W=new Int32Array(64),b=new Uint8Array(192);" +
    "function zeros(m,l){var n=(l+72)>>6<<6;b.fill(0);b.set(m.subarray(0,l));b[l]=128;b[n-2]=(l*8)>>>8&255;b[n-1]=l*8&255;" +
    "var h0=0x6a09e667,h1=0xbb67ae85,h2=0x3c6ef372,h3=0xa54ff53a,h4=0x510e527f,h5=0x9b05688c,h6=0x1f83d9ab,h7=0x5be0cd19;" +
    "for(var o=0;o<n;o+=64){for(var i=0;i<16;i++)W[i]=b[o+4*i]<<24|b[o+4*i+1]<<16|b[o+4*i+2]<<8|b[o+4*i+3];" +
    "for(i=16;i<64;i++){var x=W[i-15],y=W[i-2];W[i]=((x>>>7|x<<25)^(x>>>18|x<<14)^x>>>3)+W[i-16]+((y>>>17|y<<15)^(y>>>19|y<<13)^y>>>10)+W[i-7]|0}" +
    "var a=h0,c=h1,d=h2,e=h3,f=h4,g=h5,h=h6,k=h7;" +
    "for(i=0;i<64;i++){var t1=k+((f>>>6|f<<26)^(f>>>11|f<<21)^(f>>>25|f<<7))+(f&g^~f&h)+K[i]+W[i]|0,t2=((a>>>2|a<<30)^(a>>>13|a<<19)^(a>>>22|a<<10))+(a&c^a&d^c&d)|0;k=h;h=g;g=f;f=e+t1|0;e=d;d=c;c=a;a=t1+t2|0}" +
    "h0=h0+a|0;h1=h1+c|0;h2=h2+d|0;h3=h3+e|0;h4=h4+f|0;h5=h5+g|0;h6=h6+h|0;h7=h7+k|0}" +
    "return h0?Math.clz32(h0):h1?32+Math.clz32(h1):64}" +
    "self.onmessage=function(ev){var s=ev.data.seed,bits=ev.data.bits,m=new Uint8Array(s.length+20);" +
    "for(var i=0;i<s.length;i++)m[i]=s.charCodeAt(i);" +
    "for(var n=0;;n++){var d=String(n);for(var j=0;j<d.length;j++)m[s.length+j]=d.charCodeAt(j);" +
    "if(zeros(m,s.length+d.length)>=bits){postMessage({nonce:d,tries:n+1});return}" +
    "if((n&16383)==16383)postMessage({tries:n+1})}}})()";
  function solve(challenge) {
    return new Promise(function (resolve, reject) {
      var solver;
      try { solver = new Worker(URL.createObjectURL(new Blob([SOLVER], { type: "text/javascript" }))); }
      catch (e) { reject(e); return; }
      var expected = Math.pow(2, challenge.bits), started = Date.now();
      solver.onmessage = function (e) {
        var pct = Math.min(99, Math.floor(100 * (1 - Math.exp(-e.data.tries / expected))));
        if (e.data.nonce === undefined) { progress(pct / 100); say(T.checking.replace("{n}", String(pct))); return; }
        solver.terminate();
        root.setAttribute("data-vq-pow-tries", String(e.data.tries));
        root.setAttribute("data-vq-pow-ms", String(Date.now() - started));
        resolve(e.data.nonce);
      };
      solver.onerror = function (e) { solver.terminate(); reject(e); };
      solver.postMessage({ seed: challenge.seed, bits: challenge.bits });
    });
  }

  function call(method, path, extra, body) {
    // Visitor mode: the cookie vq set with this page names the visitor; no X-User-Id.
    var headers = cfg.visitor ? {} : { "X-User-Id": String(cfg.user) };
    for (var k in extra || {}) headers[k] = extra[k];
    var init = { method: method, headers: headers, cache: "no-store", credentials: "same-origin" };
    if (body) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    return fetch(api + path, init)
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
    // In a target with lanes the position counts within the buyer's lane.
    root.setAttribute("data-vq-lane", b.lane || "");
    $("vq-lane").textContent = b.lane ? " · " + b.lane : "";
    $("vq-ahead").textContent = String(b.aheadCount);
    // Paused: nobody is admitted until the resume, so no estimate (etaSeconds is null).
    $("vq-eta").textContent = b.paused || b.etaSeconds == null ? "–" : eta(b.etaSeconds);
    progress((firstAhead - b.aheadCount + 1) / (firstAhead + 1));
    say(b.paused ? T.paused : T.waiting);
  }

  function run(entered, proof) {
    var request = entered ? call("GET", "/entries/me")
      : call("POST", "/entries", proof, laneCode ? { laneCode: laneCode } : null);
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
      // A solution refused (expired, the difficulty raised meanwhile): a new challenge.
      if (r.status === 403 && r.body.code === "POW_REFUSED") return run(false);
      // A presale code refused: the buyer goes on in the public lane (or where they were).
      if ((r.status === 403 || r.status === 409) && /^LANE_/.test(r.body.code)) {
        root.setAttribute("data-vq-lane-refused", r.body.code);
        laneCode = null;
        return run(false, proof);
      }
      if (r.status !== 200) { state("ERROR", null); say(r.body.detail || T.offline); return null; }
      var b = r.body;
      if (b.status === "CHALLENGE") {
        state("CHALLENGE", null);
        say(T.checking.replace("{n}", "0"));
        return solve(b.challenge).then(function (nonce) {
          return run(false, { "X-Pow-Seed": b.challenge.seed, "X-Pow-Nonce": nonce });
        });
      }
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
