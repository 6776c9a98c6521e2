// The Disque dashboard: one WebSocket to the node (/ws), JSON frames.
//
// Theory of operation. Connection owns the socket: it numbers requests,
// matches replies by id (the node answers them concurrently, in any order),
// hands "event" frames to the page, and reconnects with a growing, jittered
// delay when the socket closes. On every (re)connection the page
// authenticates if it knows a password, subscribes to "stats", "nodes" and
// "cluster" (and "jobs:<queue>" for the queue being watched), then
// refreshes INFO. The cluster panel and the queues summed across nodes are
// redrawn from each "cluster" event; "Find a job" sends a findjob request,
// which this node answers after asking the others over the cluster bus.
// Each stats event (one a second) updates the overview and the queue table
// in place: rows are keyed by queue name and never rebuilt, so buttons keep
// their identity and rates can be computed from successive counters.
//
// Every string that comes from the node reaches the DOM through
// textContent or setAttribute (see el()), never innerHTML.
"use strict";

(() => {
  const RATE_POINTS = 60; // sparkline history: one point per stats event, a minute
  const RATE_SMOOTH = 5; // the number next to a sparkline: mean of the last 5 s
  const REQUEST_TIMEOUT_MS = 30000; // the page sends no blocking commands
  const MAX_EVENTS = 200; // lines kept in the event log
  const MAX_SCAN_CALLS = 50; // JSCAN calls per page before showing what was found
  const INFO_REFRESH_MS = 5000;

  // ---------------------------------------------------------------- DOM

  const $ = (id) => document.getElementById(id);

  // el("td", {className: "num", dataset: {queue: q}}, "text", child): text
  // children become text nodes, so server strings are never parsed as HTML.
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    applyProps(node, props);
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function applyProps(node, props) {
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "attrs") for (const [a, v] of Object.entries(value)) node.setAttribute(a, v);
      else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
      else node[key] = value;
    }
  }

  function svg(tag, attrs) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [a, v] of Object.entries(attrs || {})) node.setAttribute(a, v);
    return node;
  }

  function setText(id, value) {
    const node = typeof id === "string" ? $(id) : id;
    const text = String(value);
    if (node.textContent !== text) node.textContent = text;
  }

  function toast(message, isError = false) {
    const item = el("div", { className: isError ? "toast err" : "toast", attrs: { role: "status" } }, message);
    $("toasts").append(item);
    setTimeout(() => item.remove(), isError ? 7000 : 3500);
  }

  // ---------------------------------------------------------------- formatting

  const numberFormat = new Intl.NumberFormat("en-US");
  const fmtInt = (n) => (typeof n === "number" ? numberFormat.format(n) : "–");

  function fmtBytes(n) {
    if (typeof n !== "number") return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
  }

  function fmtDuration(seconds) {
    if (typeof seconds !== "number") return "–";
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + "s";
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d > 0) return d + "d " + h + "h";
    if (h > 0) return h + "h " + m + "m";
    return m + "m " + (s % 60) + "s";
  }

  // Jobs waiting to be queued again ({jobs, next_in_ms}): "3 waiting ·
  // next back in 42s", or in a narrow column "3 · back in 42s";
  // next_in_ms is null when the node that has the first one did not list
  // its queue (too many queues).
  function fmtRequeue(r, short = false, noun = " waiting") {
    if (!r || typeof r.jobs !== "number") return null;
    const waiting = fmtInt(r.jobs) + (short ? "" : noun);
    if (typeof r.next_in_ms !== "number") return waiting;
    const next = r.next_in_ms < 1000 ? "due now" : (short ? "back in " : "next back in ") +
      fmtDuration(r.next_in_ms / 1000);
    return waiting + " · " + next;
  }

  // A cell for a Waiting column: the short form, the long one as its title.
  function fillRequeue(cell, r) {
    const short = fmtRequeue(r, true);
    setText(cell, short === null ? "—" : short);
    cell.title = short === null ? REQUEUE_TITLE : fmtRequeue(r) + " · " + REQUEUE_TITLE;
    cell.classList.toggle("muted", short === null);
  }

  const REQUEUE_TITLE = "delivered and not acknowledged, or given back with a delay: " +
    "queued again when their RETRY or the delay runs out";

  function fmtRate(r) {
    if (r === null) return "–";
    return r >= 100 ? numberFormat.format(Math.round(r)) : r.toFixed(1);
  }

  const shortId = (id) => (typeof id === "string" ? id.slice(0, 8) : "");

  // A RESP string arrives as a JS string, or as {"base64": ...} when it is
  // not valid UTF-8.
  function isBinary(v) {
    return v !== null && typeof v === "object" && !Array.isArray(v) && typeof v.base64 === "string";
  }

  function binaryLabel(v) {
    let size = 0;
    try { size = atob(v.base64).length; } catch (e) { size = Math.floor((v.base64.length * 3) / 4); }
    return "binary, " + fmtInt(size) + " bytes";
  }

  function display(v) {
    if (v === null || v === undefined) return "—";
    if (isBinary(v)) return binaryLabel(v);
    if (typeof v === "object" && !Array.isArray(v) && typeof v.error === "string") return v.error;
    if (Array.isArray(v)) return v.length ? v.map(display).join(", ") : "—";
    return String(v);
  }

  // SHOW and QSTAT reply [k1, v1, k2, v2, ...].
  function pairs(flat) {
    const out = {};
    if (!Array.isArray(flat)) return out;
    for (let i = 0; i + 1 < flat.length; i += 2) out[String(flat[i])] = flat[i + 1];
    return out;
  }

  // ---------------------------------------------------------------- connection

  class Connection {
    constructor(url, handlers) {
      this.url = url;
      this.handlers = handlers; // {onOpen, onClose, onEvent, onState}
      this.ws = null;
      this.nextId = 1;
      this.pending = new Map(); // request id -> {resolve, reject, timer}
      this.attempt = 0; // consecutive failed connections, for the backoff
      this.retryTimer = null;
      this.countdown = null;
    }

    connect() {
      this.clearRetry();
      this.handlers.onState("connecting", "Connecting…");
      let ws;
      try {
        ws = new WebSocket(this.url);
      } catch (e) {
        this.scheduleRetry();
        return;
      }
      this.ws = ws;
      ws.onopen = () => { this.attempt = 0; this.handlers.onOpen(); };
      ws.onmessage = (msg) => this.receive(msg.data);
      ws.onclose = () => this.closed(ws);
      ws.onerror = () => {}; // a close event always follows
    }

    closed(ws) {
      if (this.ws !== ws) return;
      this.ws = null;
      for (const { reject, timer } of this.pending.values()) {
        clearTimeout(timer);
        reject(new Error("connection lost"));
      }
      this.pending.clear();
      this.handlers.onClose();
      this.scheduleRetry();
    }

    scheduleRetry() {
      const base = Math.min(10000, 500 * 2 ** this.attempt);
      const delay = Math.round(base * (0.8 + Math.random() * 0.4));
      this.attempt += 1;
      const due = Date.now() + delay;
      const tick = () => {
        const left = Math.max(0, Math.ceil((due - Date.now()) / 1000));
        this.handlers.onState("disconnected", "Disconnected · retrying in " + left + "s");
      };
      tick();
      this.countdown = setInterval(tick, 1000);
      this.retryTimer = setTimeout(() => this.connect(), delay);
    }

    clearRetry() {
      clearTimeout(this.retryTimer);
      clearInterval(this.countdown);
      this.retryTimer = this.countdown = null;
    }

    retryNow() {
      if (this.ws === null) { this.attempt = 0; this.connect(); }
    }

    receive(text) {
      let msg;
      try { msg = JSON.parse(text); } catch (e) { return; }
      if (msg === null || typeof msg !== "object") return;
      if (typeof msg.event === "string") { this.handlers.onEvent(msg.event, msg.data); return; }
      const waiter = this.pending.get(msg.id);
      if (waiter === undefined) {
        if (typeof msg.error === "string") toast(msg.error, true);
        return;
      }
      this.pending.delete(msg.id);
      clearTimeout(waiter.timer);
      if (typeof msg.error === "string") waiter.reject(new Error(msg.error));
      else waiter.resolve(msg.result);
    }

    // request({cmd: [...]}) or request({subscribe: [...]}): the reply's result.
    request(payload) {
      return new Promise((resolve, reject) => {
        if (this.ws === null || this.ws.readyState !== WebSocket.OPEN) {
          reject(new Error("not connected"));
          return;
        }
        const id = this.nextId++;
        const timer = setTimeout(() => {
          this.pending.delete(id);
          reject(new Error("no reply within " + REQUEST_TIMEOUT_MS / 1000 + "s"));
        }, REQUEST_TIMEOUT_MS);
        this.pending.set(id, { resolve, reject, timer });
        this.ws.send(JSON.stringify({ id, ...payload }));
      });
    }

    call(...cmd) {
      return this.request({ cmd: cmd.map(String) });
    }
  }

  const wsUrl = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
  const conn = new Connection(wsUrl, {
    onOpen: () => start(),
    onClose: () => { stopInfoTimer(); },
    onEvent: (name, data) => onServerEvent(name, data),
    onState: (state, label) => setConnState(state, label),
  });

  function setConnState(state, label) {
    const pill = $("conn-state");
    pill.dataset.state = state;
    setText(pill, label);
    $("conn-retry").hidden = state !== "disconnected";
  }

  // ---------------------------------------------------------------- session

  let password = null; // kept in memory only, sent again after a reconnect
  let watched = null; // the queue whose job events are streamed to the log

  const isNoAuth = (e) => /^NOAUTH\b/.test(e.message);

  async function start() {
    setConnState("connecting", "Connected · starting…");
    try {
      if (password !== null) await authenticate();
      await conn.request({ subscribe: ["stats", "nodes", "cluster"] });
    } catch (e) {
      if (isNoAuth(e) || /password/i.test(e.message)) askPassword(password === null ? "" : e.message);
      else if (e.message !== "connection lost") toast("Could not subscribe: " + e.message, true);
      return;
    }
    setConnState("connected", "Connected");
    if (watched !== null) subscribeJobs(watched);
    refreshInfo();
    startInfoTimer();
    searchJobs(jobs.cursors[jobs.cursors.length - 1]);
  }

  async function authenticate() {
    try {
      await conn.call("AUTH", password);
    } catch (e) {
      // A node without requirepass refuses AUTH; the saved password is moot.
      if (!/no password is set/i.test(e.message)) throw e;
    }
  }

  function askPassword(message) {
    setConnState("auth", "Password required");
    setText("auth-error", message || "");
    const dialog = $("auth-dialog");
    if (!dialog.open) dialog.showModal();
    $("auth-password").focus();
  }

  $("auth-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const candidate = $("auth-password").value;
    try {
      await conn.call("AUTH", candidate);
    } catch (e) {
      setText("auth-error", e.message);
      return;
    }
    password = candidate;
    $("auth-dialog").close();
    setText("auth-error", "");
    start();
  });

  $("conn-retry").addEventListener("click", () => conn.retryNow());
  // Escape would close the dialog and leave a page that can do nothing.
  $("auth-dialog").addEventListener("cancel", (ev) => ev.preventDefault());

  function onServerEvent(name, data) {
    if (name === "stats") onStats(data);
    else if (name === "nodes") onNodes(data);
    else if (name === "cluster") onCluster(data);
    else if (name === "job") onJobEvent(data);
    else if (name === "error") onStreamDropped(data);
  }

  // The node drops a subscription whose events this page did not read in
  // time (a busy tab); take it again a little later.
  function onStreamDropped(d) {
    const topic = d && typeof d.topic === "string" ? d.topic : null;
    toast((d && d.error) || "a subscription was dropped", true);
    if (topic === null) return;
    setTimeout(() => {
      const wanted = ["stats", "nodes", "cluster", "jobs:" + watched].includes(topic);
      if (wanted) conn.request({ subscribe: [topic] }).catch(() => {});
    }, 2000);
  }

  // ---------------------------------------------------------------- overview

  const opsHistory = [];
  const memHistory = [];
  let serverNow = null; // the node's clock (ms) from the last stats event

  function onStats(d) {
    if (!d || typeof d !== "object") return;
    serverNow = d.time;
    const nodeId = $("node-id");
    setText(nodeId, shortId(d.node_id));
    nodeId.title = d.node_id || "";
    document.title = "Disque · " + shortId(d.node_id);
    if (d.release) {
      const release = $("node-release");
      setText(release, "disque-trio " + d.release);
      release.title = "release " + d.release + ", commit " + (d.commit || "unknown");
    }
    setText("stat-uptime", fmtDuration(d.uptime));
    if (typeof d.time === "number" && typeof d.uptime === "number") {
      setText("stat-started", "since " + new Date(d.time - d.uptime * 1000).toLocaleString([], {
        month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false,
      }));
    }
    setText("stat-clients", fmtInt(d.clients));
    setText("stat-blocked", fmtInt(d.blocked_clients));
    setText("stat-memory", fmtBytes(d.used_memory));
    setText("stat-ops", fmtInt(d.ops_per_sec));
    pushBounded(opsHistory, d.ops_per_sec || 0, RATE_POINTS);
    drawSpark($("spark-ops"), opsHistory, Math.max(1, ...opsHistory), "ops");
    pushBounded(memHistory, d.used_memory || 0, RATE_POINTS);
    // Memory moves little relative to its size: scale to its own range.
    const low = Math.min(...memHistory), high = Math.max(...memHistory);
    const pad = Math.max(1, (high - low) * 0.25);
    drawSpark($("spark-mem"), memHistory, high + pad, "ops", Math.max(0, low - pad));
    const aof = d.aof || {};
    setText("stat-aof", aof.enabled ? "on" : "off");
    setText("stat-aof-size", aof.enabled ? fmtBytes(aof.size) : "append-only file disabled");
    showJobStates(d.jobs || {});
    updateQueues(Array.isArray(d.queues) ? d.queues : [], d.time);
  }

  function showJobStates(j) {
    setText("jobs-total", fmtInt(j.total));
    const states = [["queued", j.queued], ["active", j.active], ["acked", j.acked], ["wait-repl", j.wait_repl]];
    const sum = states.reduce((acc, [, n]) => acc + (n || 0), 0);
    const segs = $("jobs-bar").children;
    states.forEach(([name, n], i) => {
      setText("jobs-" + name, fmtInt(n));
      segs[i].style.width = sum > 0 ? ((100 * (n || 0)) / sum).toFixed(2) + "%" : "0";
    });
  }

  function pushBounded(list, value, limit) {
    list.push(value);
    while (list.length > limit) list.shift();
  }

  // A sparkline: a line over a light area, scaled to [min, max]. The points
  // spread over the whole width, so a young history is not a speck.
  function drawSpark(target, values, max, kind, min = 0) {
    const w = 120, h = 24;
    target.setAttribute("viewBox", "0 0 " + w + " " + h);
    target.classList.add(kind);
    const base = svg("line", { x1: 0, y1: h - 0.5, x2: w, y2: h - 0.5, class: "base" });
    if (values.length < 2) { target.replaceChildren(base); return; }
    const step = w / (values.length - 1);
    const pts = values.map((v, i) => {
      const y = h - 1 - ((Math.min(v, max) - min) / (max - min)) * (h - 3);
      return (i * step).toFixed(1) + "," + y.toFixed(1);
    });
    const area = "0," + h + " " + pts.join(" ") + " " + w + "," + h;
    target.replaceChildren(base, svg("polygon", { points: area }), svg("polyline", { points: pts.join(" ") }));
  }

  // ---------------------------------------------------------------- queues

  const PAUSE_LOOK = {
    none: ["running", "badge-ok"],
    in: ["paused in", "badge-warn"],
    out: ["paused out", "badge-warn"],
    all: ["paused", "badge-bad"],
  };

  const queues = new Map(); // name -> {row, cells, samples, inRates, outRates}

  function updateQueues(list, time) {
    const seen = new Set();
    for (const q of list) {
      if (!q || typeof q.name !== "string") continue;
      seen.add(q.name);
      let entry = queues.get(q.name);
      if (entry === undefined) {
        entry = newQueueEntry(q.name);
        queues.set(q.name, entry);
        insertSorted($("queues-body"), entry.row, q.name);
      }
      sampleRates(entry, q, time);
      fillQueueRow(entry, q);
    }
    for (const [name, entry] of queues) {
      if (!seen.has(name)) { entry.row.remove(); queues.delete(name); }
    }
    setText("queues-count", queues.size ? "(" + queues.size + ")" : "");
    $("queues-empty").hidden = queues.size > 0;
    updateQueueNames();
  }

  function insertSorted(tbody, row, name) {
    for (const other of tbody.rows) {
      if (other.dataset.queue > name) { tbody.insertBefore(row, other); return; }
    }
    tbody.append(row);
  }

  function newQueueEntry(name) {
    const cells = {
      name: el("button", { className: "qname", type: "button", title: "Browse and follow this queue" }, name),
      meta: el("span", { className: "qmeta" }),
      len: el("span", { className: "len" }),
      requeue: el("td", { className: "requeue", dataset: { field: "requeue" } }),
      blocked: el("td", { className: "num" }),
      inSpark: svg("svg", { class: "spark in", viewBox: "0 0 120 24", preserveAspectRatio: "none" }),
      inNum: el("span", { className: "rate-num" }),
      outSpark: svg("svg", { class: "spark out", viewBox: "0 0 120 24", preserveAspectRatio: "none" }),
      outNum: el("span", { className: "rate-num" }),
      importRate: el("td", { className: "num" }),
      pause: el("span", { className: "badge", dataset: { field: "pause" } }),
      buttons: {},
    };
    cells.name.addEventListener("click", () => selectQueue(name));
    const actions = el("div", { className: "actions" });
    for (const [action, label, mode] of [
      ["pause-in", "Pause in", "in"],
      ["pause-out", "Pause out", "out"],
      ["pause-all", "Pause all", "all"],
      ["resume", "Resume", "none"],
    ]) {
      const b = el("button", {
        className: "btn btn-small",
        type: "button",
        dataset: { action, queue: name },
        on: { click: () => setPause(name, mode) },
      }, label);
      cells.buttons[mode] = b;
      actions.append(b);
    }
    const row = el("tr", { dataset: { queue: name } },
      el("td", null, cells.name, cells.meta),
      el("td", { className: "num" }, cells.len),
      cells.requeue,
      cells.blocked,
      el("td", null, el("div", { className: "rate" }, cells.inSpark, cells.inNum)),
      el("td", null, el("div", { className: "rate" }, cells.outSpark, cells.outNum)),
      cells.importRate,
      el("td", null, cells.pause),
      el("td", null, actions));
    if (name === watched) row.classList.add("selected");
    return { row, cells, samples: [], inRates: [], outRates: [] };
  }

  // Rates from the jobs_in/jobs_out counters of two successive stats events.
  function sampleRates(entry, q, time) {
    const prev = entry.samples[entry.samples.length - 1];
    const cur = { time, jin: q.jobs_in || 0, jout: q.jobs_out || 0 };
    entry.samples = [cur];
    if (prev === undefined || !(time > prev.time)) return;
    const dt = (time - prev.time) / 1000;
    pushBounded(entry.inRates, Math.max(0, cur.jin - prev.jin) / dt, RATE_POINTS);
    pushBounded(entry.outRates, Math.max(0, cur.jout - prev.jout) / dt, RATE_POINTS);
  }

  const recentMean = (rates) => {
    if (rates.length === 0) return null;
    const tail = rates.slice(-RATE_SMOOTH);
    return tail.reduce((a, b) => a + b, 0) / tail.length;
  };

  function fillQueueRow(entry, q) {
    const c = entry.cells;
    // A queue this node has no queue of, listed for the copies of its jobs
    // that wait here to be queued again, has no age.
    setText(c.meta, typeof q.age === "number" ? "age " + fmtDuration(q.age) + " · idle " + fmtDuration(q.idle)
      : "no queue here · copies of its jobs");
    setText(c.len, fmtInt(q.len));
    fillRequeue(c.requeue, q.requeue);
    setText(c.blocked, fmtInt(q.blocked));
    const max = Math.max(1, ...entry.inRates, ...entry.outRates);
    drawSpark(c.inSpark, entry.inRates, max, "in");
    drawSpark(c.outSpark, entry.outRates, max, "out");
    setText(c.inNum, fmtRate(recentMean(entry.inRates)));
    setText(c.outNum, fmtRate(recentMean(entry.outRates)));
    setText(c.importRate, fmtInt(q.import_rate));
    showPause(entry, q.pause);
  }

  function showPause(entry, state) {
    const look = PAUSE_LOOK[state] || [String(state), "badge-neutral"];
    const row = entry.row;
    row.dataset.pause = String(state);
    row.classList.toggle("paused-row", state === "all");
    row.classList.toggle("paused-part", state === "in" || state === "out");
    setText(entry.cells.pause, look[0]);
    entry.cells.pause.className = "badge " + look[1];
    for (const [mode, button] of Object.entries(entry.cells.buttons)) {
      if (mode === "none") button.disabled = state === "none";
      else button.setAttribute("aria-pressed", String(state === mode));
    }
  }

  async function setPause(name, mode) {
    try {
      const state = await conn.call("PAUSE", name, mode);
      const entry = queues.get(name);
      if (entry !== undefined) showPause(entry, state);
      toast(mode === "none" ? "Queue " + name + " resumed" : "Queue " + name + ": " + PAUSE_LOOK[state][0]);
    } catch (e) {
      toast("PAUSE " + name + " " + mode + ": " + e.message, true);
    }
  }

  function updateQueueNames() {
    const list = $("queue-names");
    const names = [...queues.keys()].sort();
    if (list.children.length === names.length && names.every((n, i) => list.children[i].value === n)) return;
    list.replaceChildren(...names.map((n) => el("option", { value: n })));
  }

  // Watch a queue: highlight it, stream its job events, browse its jobs.
  function selectQueue(name) {
    if (watched !== name) {
      if (watched !== null) conn.request({ unsubscribe: ["jobs:" + watched] }).catch(() => {});
      watched = name;
      clearEvents();
      subscribeJobs(name);
    }
    for (const [n, entry] of queues) entry.row.classList.toggle("selected", n === name);
    setText("events-queue", "· " + name);
    $("events-empty").hidden = true;
    $("jscan-queue").value = name;
    searchJobs("0", true);
  }

  function subscribeJobs(name) {
    conn.request({ subscribe: ["jobs:" + name] }).catch((e) => {
      if (e.message !== "connection lost") toast("Could not follow " + name + ": " + e.message, true);
    });
  }

  // ---------------------------------------------------------------- job browser

  const jobs = {
    generation: 0, // bumped by every search; replies to older ones are dropped
    cursors: ["0"], // the start cursor of every page seen so far
    next: "0", // where the next page starts; "0" when the scan is complete
    selected: null, // the job id shown in the detail panel
    changes: 0, // job events on the watched queue since this page was listed
  };

  function jscanArgs(cursor) {
    const count = Math.max(1, Math.min(1000, parseInt($("jscan-count").value, 10) || 25));
    const args = ["JSCAN", cursor, "COUNT", count];
    const queue = $("jscan-queue").value.trim();
    if (queue) args.push("QUEUE", queue);
    for (const box of document.querySelectorAll('#jscan-form input[name="state"]:checked')) {
      args.push("STATE", box.value);
    }
    args.push("REPLY", "all");
    return { args, count };
  }

  // One page: JSCAN from `cursor` (without BUSYLOOP, so the node never
  // blocks on us) until `count` jobs are found or the scan is complete.
  async function searchJobs(cursor, fresh = false) {
    if (fresh) jobs.cursors = [cursor];
    const generation = ++jobs.generation;
    const found = [];
    let next = cursor;
    const { args, count } = jscanArgs(cursor);
    try {
      for (let calls = 0; calls < MAX_SCAN_CALLS; calls++) {
        args[1] = next;
        const [newCursor, items] = await conn.call(...args);
        if (generation !== jobs.generation) return;
        found.push(...items);
        next = String(newCursor);
        if (next === "0" || found.length >= count) break;
      }
    } catch (e) {
      toast("JSCAN: " + e.message, true);
      return;
    }
    jobs.next = next;
    jobs.changes = 0;
    $("jobs-stale").hidden = true;
    showJobs(found.map(pairs));
    if (jobs.selected !== null) refreshJob(jobs.selected);
  }

  function showJobs(list) {
    const body = $("jobs-body");
    body.replaceChildren(...list.map(jobRow));
    const empty = $("jobs-empty");
    empty.hidden = list.length > 0;
    setText(empty, "No jobs match.");
    const page = jobs.cursors.length;
    setText("jobs-page", "Page " + page + " · " + list.length + " job" + (list.length === 1 ? "" : "s") +
      (jobs.next === "0" ? " · end of scan" : ""));
    $("jobs-first").disabled = page <= 1;
    $("jobs-prev").disabled = page <= 1;
    $("jobs-next").disabled = jobs.next === "0";
  }

  const JOB_ACTIONS = [
    // action, label, command, enabled in state
    ["ack", "Ack", "ACKJOB", (s) => s !== "acked"],
    ["nack", "Nack", "NACK", (s) => s === "active"],
    ["dequeue", "Dequeue", "DEQUEUE", (s) => s === "queued"],
    ["enqueue", "Enqueue", "ENQUEUE", (s) => s === "active"],
    ["delete", "Delete", "DELJOB", () => true],
  ];

  function actionButtons(id, state) {
    return JOB_ACTIONS.map(([action, label, command, enabled]) => el("button", {
      className: action === "delete" ? "btn btn-small btn-danger" : "btn btn-small",
      type: "button",
      disabled: !enabled(state),
      dataset: { action, job: id },
      on: { click: (ev) => { ev.stopPropagation(); jobAction(id, command); } },
    }, label));
  }

  function stateBadge(state) {
    return el("span", { className: "badge badge-" + String(state) }, display(state));
  }

  function jobRow(job) {
    const id = String(job.id);
    const body = job.body;
    const preview = isBinary(body)
      ? el("span", { className: "binary" }, binaryLabel(body))
      : display(body);
    const row = el("tr", { dataset: { job: id }, on: { click: () => showDetail(id) } },
      el("td", null, el("button", { className: "link jid", type: "button", title: "Show " + id }, id)),
      el("td", null, display(job.queue)),
      el("td", null, stateBadge(job.state)),
      el("td", { className: "num nowrap" }, fmtDuration(job.ttl)),
      el("td", { className: "num col-nacks" }, fmtInt(job.nacks)),
      el("td", null, el("div", { className: "body-preview", title: isBinary(body) ? "" : display(body) }, preview)),
      el("td", { className: "col-actions" }, el("div", { className: "actions" }, ...actionButtons(id, job.state))));
    if (id === jobs.selected) row.classList.add("selected");
    return row;
  }

  async function jobAction(id, command) {
    try {
      const result = await conn.call(command, id);
      toast(command + " " + shortId(id) + "… → " + display(result));
    } catch (e) {
      toast(command + ": " + e.message, true);
    }
    await refreshJob(id);
  }

  // After an action: update the job's row and detail from SHOW.
  async function refreshJob(id) {
    let info;
    try { info = await conn.call("SHOW", id); } catch (e) { return; }
    const row = document.querySelector('#jobs-body tr[data-job="' + CSS.escape(id) + '"]');
    if (info === null) {
      if (row) row.remove();
      if (jobs.selected === id) closeDetail();
      return;
    }
    if (row) row.replaceWith(jobRow(pairs(info)));
    if (jobs.selected === id) fillDetail(pairs(info));
  }

  async function showDetail(id) {
    jobs.selected = id;
    for (const row of $("jobs-body").rows) row.classList.toggle("selected", row.dataset.job === id);
    let info;
    try {
      info = await conn.call("SHOW", id);
    } catch (e) {
      toast("SHOW: " + e.message, true);
      return;
    }
    if (info === null) { toast("Job " + id + " is gone"); closeDetail(); return; }
    fillDetail(pairs(info));
    $("job-detail").hidden = false;
    $("job-detail").closest(".jobs-layout").classList.add("with-detail");
  }

  function fillDetail(job) {
    const id = String(job.id);
    setText("detail-id", id);
    const find = el("button", { className: "btn btn-small", type: "button", dataset: { action: "find" },
      on: { click: () => { findJob(id); $("find-card").scrollIntoView({ block: "nearest" }); } } },
    "Find in cluster");
    $("detail-actions").replaceChildren(...actionButtons(id, job.state), find);
    const dl = $("detail-fields");
    dl.replaceChildren();
    for (const [key, value] of Object.entries(job)) {
      if (key === "id" || key === "body") continue;
      dl.append(el("dt", null, key), el("dd", null, detailValue(key, value)));
    }
    const body = $("detail-body");
    if (isBinary(job.body)) setText(body, "(" + binaryLabel(job.body) + ", base64)\n" + job.body.base64);
    else setText(body, display(job.body));
  }

  function detailValue(key, value) {
    if (key === "state") return stateBadge(value);
    if (key === "ctime" && typeof value === "number") {
      // ctime is ms * 1e6 + a counter (beyond 2^53: only the ms are kept).
      return new Date(Math.floor(value / 1e6)).toLocaleString();
    }
    if ((key === "ttl" || key === "delay" || key === "retry") && typeof value === "number") {
      return fmtDuration(value) + (key === "ttl" ? " left" : "");
    }
    if (key.endsWith("-within") && typeof value === "number") return fmtDuration(value / 1000);
    if (key.startsWith("nodes-") && Array.isArray(value)) return value.length ? value.map(shortId).join(", ") : "—";
    return display(value);
  }

  function closeDetail() {
    jobs.selected = null;
    $("job-detail").hidden = true;
    $("job-detail").closest(".jobs-layout").classList.remove("with-detail");
    for (const row of $("jobs-body").rows) row.classList.remove("selected");
  }

  $("detail-close").addEventListener("click", closeDetail);
  $("jscan-form").addEventListener("submit", (ev) => { ev.preventDefault(); searchJobs("0", true); });
  $("jobs-first").addEventListener("click", () => searchJobs("0", true));
  $("jobs-prev").addEventListener("click", () => {
    jobs.cursors.pop();
    searchJobs(jobs.cursors[jobs.cursors.length - 1]);
  });
  $("jobs-stale").addEventListener("click", () => searchJobs(jobs.cursors[jobs.cursors.length - 1]));
  $("jobs-next").addEventListener("click", () => {
    jobs.cursors.push(jobs.next);
    searchJobs(jobs.next);
  });

  // ---------------------------------------------------------------- add job

  function addjobArgs() {
    const queue = $("add-queue").value.trim();
    const args = ["ADDJOB", queue, $("add-body").value, $("add-timeout").value || "0"];
    for (const [option, id] of [["REPLICATE", "add-replicate"], ["DELAY", "add-delay"],
      ["RETRY", "add-retry"], ["TTL", "add-ttl"]]) {
      const value = $(id).value.trim();
      if (value !== "") args.push(option, value);
    }
    if ($("add-async").checked) args.push("ASYNC");
    return { queue, args };
  }

  $("addjob-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const { queue, args } = addjobArgs();
    const result = $("addjob-result");
    const submit = $("add-submit");
    submit.disabled = true;
    try {
      const id = String(await conn.call(...args));
      result.className = "result ok";
      result.replaceChildren("Added ", el("code", null, id));
      selectQueue(queue);
      showDetail(id);
    } catch (e) {
      result.className = "result err";
      result.replaceChildren(e.message);
    } finally {
      submit.disabled = false;
    }
  });

  // ---------------------------------------------------------------- events

  function onJobEvent(d) {
    if (!d || d.queue !== watched) return;
    const log = $("events-log");
    const time = new Date().toLocaleTimeString([], { hour12: false });
    const id = String(d.id);
    const item = el("li", { className: "fresh", dataset: { what: String(d.what) } },
      el("time", null, time),
      el("span", { className: "badge what-" + String(d.what) }, display(d.what)),
      el("span", { className: "jid", title: id, on: { click: () => showDetail(id) } }, id));
    log.prepend(item);
    while (log.children.length > MAX_EVENTS) log.lastElementChild.remove();
    noteJobChange(d.queue);
    if (id === jobs.selected) refreshJob(id);
  }

  // The job list is not redrawn under the user's pointer; it offers a
  // refresh when jobs of the listed queue have changed since.
  function noteJobChange(queue) {
    const listed = $("jscan-queue").value.trim();
    if (listed !== "" && listed !== queue) return;
    jobs.changes += 1;
    const button = $("jobs-stale");
    setText(button, "↻ " + jobs.changes + (jobs.changes === 1 ? " change" : " changes") + " · refresh");
    button.hidden = false;
  }

  function clearEvents() {
    $("events-log").replaceChildren();
  }

  $("events-clear").addEventListener("click", clearEvents);

  // ---------------------------------------------------------------- cluster

  // The "nodes" event (membership, flag or link changes) only names this
  // node's address now: the cluster panel draws from the "cluster" event,
  // which carries the same table, with each node's figures, every second.
  function onNodes(list) {
    if (!Array.isArray(list)) return;
    const self = list.find((n) => n && n.link === "self");
    if (self) setText("node-addr", self.addr || "");
  }

  // "unreachable": our link to it is down and it is not (yet) PFAIL: a
  // killed node is so for up to cluster-node-timeout, never "ok".
  const STATE_LOOK = { ok: ["ok", "badge-ok"], pfail: ["PFAIL", "badge-warn"], fail: ["FAIL", "badge-bad"],
    leaving: ["LEAVING", "badge-warn"], handshake: ["handshake", "badge-warn"], noaddr: ["no address", "badge-warn"],
    unreachable: ["unreachable", "badge-warn"] };
  const STATE_TITLE = { unreachable: "link down, not marked PFAIL yet (within cluster-node-timeout)" };
  const LINK_LOOK = { self: "badge-neutral", connected: "badge-ok", disconnected: "badge-bad" };
  const AOF_LOOK = { off: "badge-neutral", on: "badge-ok", rewriting: "badge-warn",
    "wait-rewrite": "badge-warn", failing: "badge-bad" };
  // Why a node has no figures (clustersnap.py), as the panel words it.
  const NO_FIGURES = { unreachable: "unreachable", "older release": "older release: no figures",
    "no answer": "no answer", asking: "asking…" };

  const badge = (text, look) => el("span", { className: "badge " + look }, text);
  const isDown = (n) => n.state === "pfail" || n.state === "fail";
  const dash = () => el("span", { className: "muted" }, "—");

  function onCluster(d) {
    if (!d || !Array.isArray(d.nodes)) return;
    $("cluster-body").replaceChildren(...d.nodes.map((n) => clusterRow(n, d.time)));
    const failing = d.nodes.filter(isDown).length;
    const unreachable = d.nodes.filter((n) => n.state === "unreachable").length;
    setText("cluster-count", "(" + d.nodes.length + (d.nodes.length === 1 ? " node" : " nodes") +
      (failing ? " · " + failing + " failing" : "") + (unreachable ? " · " + unreachable + " unreachable" : "") + ")");
    $("cluster-count").classList.toggle("bad", failing > 0);
    $("cluster-count").classList.toggle("warn", failing === 0 && unreachable > 0);
    clusterTotals(d);
    clusterQueues(d.queues || {}, d.nodes);
  }

  function clusterRow(n, now) {
    const f = n.figures;
    const state = STATE_LOOK[n.state] || [String(n.state), "badge-neutral"];
    const counted = typeof f?.jobs_counted === "number"
      ? " · counts " + fmtInt(f.jobs_counted) + " of the cluster's jobs" : "";
    const waiting = f ? fmtRequeue(f.requeue) : null;
    const cells = f ? [
      el("td", { className: "num", title: "copies held: " + jobBreakdown(f.jobs) + counted }, fmtInt(f.jobs.total)),
      el("td", { className: "num", title: waiting === null ? "" : waiting + " (counted here)" }, fmtInt(f.jobs.queued)),
      el("td", { className: "num" }, fmtInt(f.queues)),
      el("td", { className: "num" }, fmtBytes(f.used_memory)),
      el("td", { title: f.aof.state === "off" ? "" : fmtBytes(f.aof.size) },
        badge(f.aof.state, AOF_LOOK[f.aof.state] || "badge-neutral")),
    ] : [0, 1, 2, 3, 4].map((i) => el("td", { className: i < 4 ? "num" : "" }, dash()));
    const age = f ? (n.figures_age_ms < 1500 ? "live" : fmtDuration(n.figures_age_ms / 1000) + " old") : null;
    const why = NO_FIGURES[n.no_figures] || display(n.no_figures);
    const look = isDown(n) ? "node-down" : n.state === "ok" ? "" :
      n.state === "unreachable" ? "node-warn node-unreachable" : "node-warn";
    return el("tr", { className: look, dataset: { node: String(n.id), state: String(n.state) } },
      el("td", null, el("code", { title: String(n.id) }, shortId(n.id)),
        n.myself ? el("span", { className: "tag" }, "this node") : null),
      el("td", null, el("code", null, display(n.addr))),
      el("td", { title: STATE_TITLE[n.state] || "", dataset: { field: "state" } }, badge(state[0], state[1])),
      el("td", { dataset: { field: "link" } }, badge(display(n.link), LINK_LOOK[n.link] || "badge-neutral")),
      ...cells,
      el("td", { className: "num" }, n.myself ? "—" : ago(n.last_pong, now)),
      el("td", { dataset: { field: "figures" } }, f ? el("span", { className: "muted" }, age)
        : el("span", { className: isDown(n) || n.no_figures === "unreachable" ? "why bad" : "why" }, why)));
  }

  function jobBreakdown(j) {
    return "queued " + fmtInt(j.queued) + " · active " + fmtInt(j.active) + " · acked " + fmtInt(j.acked) +
      " · wait-repl " + fmtInt(j.wait_repl);
  }

  // Each node counts the copies it holds; the jobs are counted once each
  // (by one of their holders, clustersnap.py): "14 jobs · 28 copies".
  function clusterTotals(d) {
    const t = d.totals || {};
    const jobs = t.jobs || {};
    const label = "Cluster · figures from " + fmtInt(t.with_figures) + " of " + fmtInt(t.nodes) + " nodes";
    const distinct = typeof t.distinct_jobs === "number"
      ? [el("b", { dataset: { field: "distinct" } }, fmtInt(t.distinct_jobs)), " jobs · "]
      : [el("span", { className: "muted", title: "a node of an older release does not count its jobs" },
        "jobs unknown"), " · "];
    const one = t.requeue && t.requeue.jobs === 1;
    const waiting = fmtRequeue(t.requeue, false, one ? " job waiting for its RETRY or a delay"
      : " jobs waiting for their RETRY or a delay");
    $("cluster-foot").replaceChildren(el("tr", null,
      el("td", { colSpan: 4 }, label, waiting === null ? null
        : el("span", { className: "sub", title: REQUEUE_TITLE, dataset: { field: "requeue" } }, waiting)),
      el("td", { className: "num nowrap", title: "copies: " + jobBreakdown(jobs), dataset: { field: "jobs" } },
        ...distinct, el("span", { dataset: { field: "copies" } }, fmtInt(jobs.total) + " copies")),
      el("td", { className: "num" }, fmtInt(jobs.queued)),
      el("td", null), el("td", { className: "num" }, fmtBytes(t.used_memory)),
      el("td", { colSpan: 3 })));
  }

  // One column per node, in the panel's order: a node without figures
  // shows "–" (not counted), one with figures and no such queue 0.
  function clusterQueues(q, nodes) {
    const rows = Array.isArray(q.rows) ? q.rows : [];
    const counted = new Set(Array.isArray(q.nodes) ? q.nodes : []);
    $("cqueues-head").replaceChildren(el("th", null, "Queue"), el("th", { className: "num" }, "Total"),
      el("th", { title: REQUEUE_TITLE }, "Waiting"),
      ...nodes.map((n) => el("th", { className: "num nodecol" + (counted.has(n.id) ? "" : " uncounted"),
        title: n.addr + (counted.has(n.id) ? "" : " · not counted") }, shortId(n.id))));
    $("cqueues-body").replaceChildren(...rows.map((r) => el("tr", { dataset: { queue: display(r.name) } },
      el("td", null, el("span", { className: "qlabel" }, display(r.name))),
      el("td", { className: "num total" }, fmtInt(r.total)),
      requeueCell(r.requeue),
      ...nodes.map((n) => el("td", { className: "num" + (counted.has(n.id) ? "" : " uncounted"), dataset: { node: n.id } },
        counted.has(n.id) ? fmtInt((r.lengths || {})[n.id] || 0) : "–")))));
    $("cqueues-empty").hidden = rows.length > 0;
    setText("cqueues-count", rows.length ? "(" + rows.length + " · " + fmtInt(q.total) + " jobs queued" +
      (q.requeue ? " · " + fmtInt(q.requeue) + " waiting" : "") + ")" : "");
    const missing = nodes.filter((n) => !counted.has(n.id)).map((n) => n.addr);
    let note = "summed over " + counted.size + " of " + nodes.length + " nodes";
    if (missing.length) note += " · not counted: " + missing.join(", ");
    if (q.omitted_jobs) note += " · " + fmtInt(q.omitted_jobs) + " jobs in queues not listed";
    if (q.omitted_requeue) note += " · " + fmtInt(q.omitted_requeue) + " waiting in queues not listed";
    setText("cqueues-note", note);
  }

  function requeueCell(r) {
    const cell = el("td", { className: "requeue", dataset: { field: "requeue" } });
    fillRequeue(cell, r);
    return cell;
  }

  function ago(ms, now) {
    if (typeof ms !== "number" || ms <= 0) return "never";
    return fmtDuration(((now || serverNow || Date.now()) - ms) / 1000) + " ago";
  }

  // ---------------------------------------------------------------- find a job

  // {findjob: id}: this node asks the nodes that may hold a copy over the
  // bus and answers with one row per node (a down node is not asked).
  async function findJob(id) {
    if (!id) return;
    $("find-id").value = id;
    const submit = $("find-submit");
    submit.disabled = true;
    const summary = $("find-summary");
    summary.className = "result";
    setText(summary, "Asking the cluster…");
    try {
      showCopies(await conn.request({ findjob: id }));
    } catch (e) {
      summary.className = "result err";
      setText(summary, e.message);
      $("find-table").hidden = true;
    } finally {
      submit.disabled = false;
    }
  }

  function showCopies(r) {
    const copies = Array.isArray(r.copies) ? r.copies : [];
    const summary = $("find-summary");
    summary.className = r.held ? "result ok" : "result";
    summary.replaceChildren(el("code", null, String(r.id)), " · " + (r.held ? r.held + (r.held === 1 ?
      " copy" : " copies") + " held" : "no copy held") + " · " + copies.length + " nodes looked at");
    $("find-body").replaceChildren(...copies.map(copyRow));
    $("find-table").hidden = copies.length === 0;
  }

  function copyRow(c) {
    const state = STATE_LOOK[c.node_state] || ["unknown", "badge-neutral"];
    const held = c.status === "held";
    const what = held ? stateBadge(c.state) : el("span", { className: "why" + (c.status === "unreachable" ? " bad" : "") },
      c.status === "gone" ? "gone: " + display(c.gone) : NO_FIGURES[c.status] === undefined ? display(c.status)
        : c.status === "older release" ? "older release: not asked" : NO_FIGURES[c.status]);
    const num = (v) => el("td", { className: "num" }, held ? v : "—");
    return el("tr", { className: c.node_state === "pfail" || c.node_state === "fail" ? "node-down" : "",
      dataset: { node: String(c.node), status: String(c.status) } },
      el("td", null, el("code", { title: String(c.node) }, shortId(c.node)), " ",
        el("span", { className: "muted small" }, display(c.addr)),
        c.myself ? el("span", { className: "tag" }, "this node") : null),
      el("td", null, badge(state[0], state[1])),
      el("td", { dataset: { field: "copy" } }, what),
      el("td", null, held ? display(c.queue) : "—"),
      num(fmtInt(c.nacks)), num(fmtInt(c.deliveries)),
      num(typeof c.requeue_in_ms === "number" ? "in " + fmtDuration(c.requeue_in_ms / 1000) : "—"),
      num(fmtDuration(c.ttl)));
  }

  $("find-form").addEventListener("submit", (ev) => { ev.preventDefault(); findJob($("find-id").value.trim()); });

  // ---------------------------------------------------------------- INFO

  const infoOpen = new Map(); // section name -> open, remembered across refreshes
  const INFO_OPEN_BY_DEFAULT = new Set(["Server", "Clients", "Memory", "Jobs", "Queues", "Stats"]);
  let infoTimer = null;

  function parseInfo(text) {
    const sections = [];
    for (const raw of String(text).split(/\r?\n/)) {
      const line = raw.trim();
      if (line.startsWith("#")) sections.push({ name: line.replace(/^#+\s*/, ""), fields: [] });
      else if (line.includes(":")) {
        if (sections.length === 0) sections.push({ name: "Info", fields: [] });
        const at = line.indexOf(":");
        sections[sections.length - 1].fields.push([line.slice(0, at), line.slice(at + 1)]);
      }
    }
    return sections;
  }

  async function refreshInfo() {
    let text;
    try { text = await conn.call("INFO"); } catch (e) { return; }
    if (isBinary(text)) return;
    $("info-sections").replaceChildren(...parseInfo(text).map(infoSection));
  }

  function infoSection({ name, fields }) {
    const open = infoOpen.has(name) ? infoOpen.get(name) : INFO_OPEN_BY_DEFAULT.has(name);
    const details = el("details", { open, dataset: { section: name } },
      el("summary", null, el("span", { className: "name" }, name),
        el("span", { className: "muted small" }, String(fields.length))),
      el("dl", { className: "kv" }, ...fields.flatMap(([k, v]) => [el("dt", null, k), el("dd", null, v)])));
    details.addEventListener("toggle", () => infoOpen.set(name, details.open));
    return details;
  }

  function startInfoTimer() {
    stopInfoTimer();
    infoTimer = setInterval(() => { if (!document.hidden) refreshInfo(); }, INFO_REFRESH_MS);
  }

  function stopInfoTimer() {
    clearInterval(infoTimer);
    infoTimer = null;
  }

  $("info-refresh").addEventListener("click", refreshInfo);

  conn.connect();
})();
