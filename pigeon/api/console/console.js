// Pigeon's web console: a client of the node's REST API and nothing else (the Pub/Sub v1 routes, and
// pigeon.v1.Monitoring's /v1/{project}/topicStats, /subscriptionStats, /v1/projects, /v1/cluster for the
// figures Cloud Monitoring would show). Every change goes through the same calls curl or gcloud would make, so
// validation and errors are the server's; an error is shown as the server worded it.

const POLL_MS = 2000;
const HISTORY = 150; // points kept per series: five minutes at one every two seconds

// --- the REST API ----------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(e) { super(e.message || `HTTP ${e.code}`); this.code = e.code; this.status = e.status; }
}

// every call carries the token signed in with (a token file's bearer token or an OIDC access token); kept in
// sessionStorage: this tab only, gone when it closes
const TOKEN_KEY = "pigeon.token";
const auth = {
  token: () => sessionStorage.getItem(TOKEN_KEY) || "",
  signedOut: false, // a call answered 401: the sign-in prompt is up; views and polling wait for a token
};

async function api(method, path, body) {
  const init = { method, headers: {} };
  const token = auth.token();
  if (token) init.headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) { init.body = JSON.stringify(body); init.headers["Content-Type"] = "application/json"; }
  const r = await fetch(path, init);
  const j = await r.json().catch(() => ({}));
  const e = j.error || { code: r.status, message: r.statusText };
  if (r.status === 401) askToSignIn(e.message, token);
  if (!r.ok) throw new ApiError({ ...e, code: r.status });
  return j;
}

async function listAll(path, field) {
  const out = [];
  let token = "";
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api("GET", `${path}${sep}pageSize=1000${token ? `&pageToken=${encodeURIComponent(token)}` : ""}`);
    out.push(...(page[field] || []));
    token = page.nextPageToken || "";
  } while (token);
  return out;
}

// --- small helpers -----------------------------------------------------------------------------------------
const $ = (sel, root = document) => root.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const short = (name) => name.split("/").pop();
const fmt = (n) => (n === undefined || n === null || Number.isNaN(n)) ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: n < 10 ? 1 : 0 });
const num = (v) => Number(v || 0); // int64 fields arrive as strings in proto3 JSON

function age(s) {
  s = Number(s || 0);
  if (s < 1) return s ? "<1 s" : "–";
  if (s < 120) return `${s.toFixed(0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(0)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function b64encode(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  bytes.forEach((b) => { bin += String.fromCharCode(b); });
  return btoa(bin);
}

function b64decode(data) {
  const bin = atob(data || "");
  const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
  try { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch { return `(binary, base64) ${data}`; }
}

function parseAttributes(text) {
  const out = {};
  for (const line of text.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const i = line.indexOf("=");
    if (i <= 0) throw new ApiError({ message: `attribute "${line}" is not key=value` });
    out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  return out;
}

function toast(text, bad = false) {
  const t = $("#toast");
  t.textContent = text;
  t.className = bad ? "bad" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, bad ? 8000 : 3000);
}

// run an action from a button or form, showing the server's error if it fails
async function act(fn, done) {
  try {
    const r = await fn();
    if (done) toast(done);
    return r;
  } catch (e) {
    if (e.code !== 401) toast(e.message, true); // a 401 brought up the sign-in prompt instead
    return undefined;
  }
}

// --- live figures: polled, kept as short histories, drawn as sparklines --------------------------------------
const live = {
  topics: new Map(), // name → TopicStats of the last poll
  subs: new Map(), // name → SubscriptionStats of the last poll
  history: new Map(), // series key → [[t, value], …]
  listeners: new Set(),
  project: "",
};

function record(key, t, value) {
  let h = live.history.get(key);
  if (!h) live.history.set(key, (h = []));
  h.push([t, value]);
  if (h.length > HISTORY) h.shift();
}

// a counter's rate between the last two polls (a counter that went down: its bundle moved, the rate restarts)
function rate(prev, cur, field, dt) {
  if (!prev || dt <= 0) return 0;
  const d = num(cur[field]) - num(prev[field]);
  return d > 0 ? d / dt : 0;
}

async function poll() {
  const p = live.project;
  if (!p || auth.signedOut) return;
  try {
    const [topics, subs] = await Promise.all([
      listAll(`/v1/projects/${p}/topicStats`, "topics"),
      listAll(`/v1/projects/${p}/subscriptionStats`, "subscriptions"),
    ]);
    if (p !== live.project) return;
    const t = Date.now() / 1000;
    const dt = live.lastPoll ? t - live.lastPoll : 0;
    live.lastPoll = t;
    const topicsNow = new Map(topics.map((x) => [x.name, x]));
    for (const [name, x] of topicsNow) {
      x.publishRate = rate(live.topics.get(name), x, "messages", dt);
      if (dt > 0) record(`${name}|publish`, t, x.publishRate); // (a rate needs two readings)
    }
    const subsNow = new Map(subs.map((x) => [x.name, x]));
    for (const [name, x] of subsNow) {
      const prev = live.subs.get(name);
      x.ackRate = rate(prev, x, "ackedMessages", dt);
      x.sendRate = rate(prev, x, "sentMessages", dt);
      record(`${name}|backlog`, t, num(x.numUndeliveredMessages));
      record(`${name}|age`, t, Number(x.oldestUnackedMessageAgeSeconds || 0));
      record(`${name}|outstanding`, t, num(x.numOutstandingMessages));
      if (dt > 0) record(`${name}|ack`, t, x.ackRate);
    }
    live.topics = topicsNow;
    live.subs = subsNow;
    $("#status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("#status").classList.remove("bad");
    for (const fn of live.listeners) fn();
  } catch (e) {
    if (e.code === 401) return;
    $("#status").textContent = `cannot read figures: ${e.message}`;
    $("#status").classList.add("bad");
  }
}

function spark(key, cls = "spark", w = 110, h = 26) {
  const pts = live.history.get(key) || [];
  if (pts.length < 2) return `<svg class="${cls}" viewBox="0 0 ${w} ${h}" preserveAspectRatio="none"></svg>`;
  const t0 = pts[0][0], t1 = pts[pts.length - 1][0];
  const max = Math.max(1e-9, ...pts.map((p) => p[1]));
  const xy = pts.map(([t, v]) => [((t - t0) / Math.max(1e-9, t1 - t0)) * w, h - 2 - (v / max) * (h - 4)]);
  const line = xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  return `<svg class="${cls}" viewBox="0 0 ${w} ${h}" preserveAspectRatio="none"><polygon points="0,${h} ${line} ${w},${h}"/><polyline points="${line}"/></svg>`;
}

// --- routing ------------------------------------------------------------------------------------------------
const views = {};
let cleanup = null; // what the view shown last leaves to stop (a timer)

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [kind, id] = parts;
  live.listeners.clear();
  if (cleanup) { cleanup(); cleanup = null; }
  for (const a of document.querySelectorAll("nav a[data-nav]")) a.classList.toggle("active", a.dataset.nav === kind);
  const main = $("#main");
  main.innerHTML = "";
  if (auth.signedOut) return; // shown again once signed in
  const view = {
    topics: id ? views.topic : views.topics,
    subscriptions: id ? views.subscription : views.subscriptions,
    snapshots: views.snapshots,
    cluster: views.cluster,
  }[kind];
  if (!view) { location.hash = "#/topics"; return; }
  cleanup = view(main, id) || null;
}

function onLive(fn) { live.listeners.add(fn); fn(); }

const topicPath = (id) => `projects/${live.project}/topics/${id}`;
const subPath = (id) => `projects/${live.project}/subscriptions/${id}`;
const topicLink = (name) => name && name.split("/")[1] === live.project
  ? `<a href="#/topics/${encodeURIComponent(short(name))}">${esc(short(name))}</a>` : `<span class="mono">${esc(name || "(deleted)")}</span>`;
const subLink = (name) => `<a href="#/subscriptions/${encodeURIComponent(short(name))}">${esc(short(name))}</a>`;

// --- topics -------------------------------------------------------------------------------------------------
views.topics = (main) => {
  main.innerHTML = `
    <h1>Topics</h1><div class="sub">in project <b>${esc(live.project)}</b></div>
    <div class="panel"><table>
      <thead><tr><th>Topic</th><th class="num">Subscriptions</th><th class="num">Published</th>
        <th class="num">msg/s</th><th></th><th class="num">Bytes</th><th></th></tr></thead>
      <tbody id="rows"><tr><td colspan="7" class="empty">loading…</td></tr></tbody></table></div>
    <div class="panel"><h2>Create a topic</h2>
      <form class="inline" id="create-topic">
        <input name="id" placeholder="topic id" required data-testid="topic-id">
        <input name="retention" placeholder="retention, e.g. 86400s (optional)">
        <input name="labels" placeholder="labels: k=v, k2=v2 (optional)">
        <button data-testid="create-topic">Create</button>
      </form></div>`;
  $("#create-topic").onsubmit = async (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const id = f.id.value.trim();
    const create = () => {
      const body = {};
      if (f.labels.value.trim()) body.labels = parseAttributes(f.labels.value.replaceAll(",", "\n"));
      if (f.retention.value.trim()) body.messageRetentionDuration = f.retention.value.trim();
      return api("PUT", `/v1/${topicPath(id)}`, body);
    };
    if (await act(create, `topic ${id} created`)) {
      f.reset();
      await poll();
    }
  };
  onLive(() => {
    const rows = [...live.topics.values()];
    $("#rows").innerHTML = rows.length ? rows.map((t) => `
      <tr data-topic="${esc(short(t.name))}"><td>${topicLink(t.name)}</td><td class="num">${fmt(t.subscriptions)}</td>
        <td class="num">${fmt(num(t.messages))}</td><td class="num">${fmt(t.publishRate)}</td>
        <td>${spark(`${t.name}|publish`)}</td><td class="num">${fmt(num(t.bytes))}</td>
        <td><button class="danger small" data-delete="${esc(short(t.name))}">Delete</button></td></tr>`).join("")
      : `<tr><td colspan="7" class="empty">No topics in this project yet.</td></tr>`;
    for (const b of main.querySelectorAll("[data-delete]")) {
      b.onclick = async () => {
        const id = b.dataset.delete;
        if (!confirm(`Delete topic ${id}? Its subscriptions stay, detached.`)) return;
        if (await act(() => api("DELETE", `/v1/${topicPath(id)}`), `topic ${id} deleted`)) await poll();
      };
    }
  });
};

views.topic = (main, id) => {
  const name = topicPath(id);
  main.innerHTML = `
    <h1>${esc(id)}</h1><div class="sub mono">${esc(name)}</div>
    <div class="figures">
      <div class="figure"><div class="label">Published</div><div class="value" id="published">–</div></div>
      <div class="figure"><div class="label">Publish rate (msg/s)</div><div class="value" id="rate">–</div><div id="rate-chart"></div></div>
      <div class="figure"><div class="label">Bytes</div><div class="value" id="bytes">–</div></div>
    </div>
    <div class="row">
      <div class="panel"><h2>Publish a message</h2>
        <form class="grid" id="publish">
          <label>Data</label><textarea name="data" data-testid="publish-data" placeholder="message text"></textarea>
          <label>Attributes</label><textarea name="attributes" placeholder="key=value, one per line"></textarea>
          <label>Ordering key</label><input name="key">
          <label>Copies</label><input name="copies" type="number" min="1" max="1000" value="1">
          <div class="actions"><button data-testid="publish">Publish</button></div>
        </form></div>
      <div class="panel"><h2>Configuration</h2><dl class="kv" id="config"></dl>
        <h2 style="margin-top:16px">Edit</h2>
        <form class="grid" id="edit">
          <label>Labels</label><input name="labels" placeholder="k=v, k2=v2">
          <label>Retention</label><input name="retention" placeholder="e.g. 604800s">
          <div class="actions"><button class="secondary">Save</button>
            <button type="button" class="danger" id="delete">Delete topic</button></div>
        </form></div>
    </div>
    <div class="panel"><h2>Subscriptions</h2><div id="subs" class="empty">loading…</div></div>
    <div class="panel" id="dlq" hidden><h2>Dead-letter topic</h2><div id="dlq-body"></div></div>`;

  const load = async () => {
    const t = await act(() => api("GET", `/v1/${name}`));
    if (!t) return;
    $("#config").innerHTML = [
      ["Labels", Object.entries(t.labels || {}).map(([k, v]) => `<span class="tag">${esc(k)}=${esc(v)}</span>`).join("") || "–"],
      ["Message retention", esc(t.messageRetentionDuration || "–")],
      ["Schema", esc(t.schemaSettings?.schema || "–")],
      ["State", esc(t.state || "ACTIVE")],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
    const f = $("#edit");
    f.labels.value = Object.entries(t.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    f.retention.value = t.messageRetentionDuration || "";
    const subs = await act(() => listAll(`/v1/${name}/subscriptions`, "subscriptions"));
    $("#subs").outerHTML = subs && subs.length
      ? `<table id="subs"><thead><tr><th>Subscription</th><th class="num">Unacked</th><th class="num">Oldest unacked</th></tr></thead><tbody>${
        subs.map((s) => `<tr><td>${s.split("/")[1] === live.project ? subLink(s) : esc(s)}</td>
          <td class="num" data-backlog="${esc(s)}">–</td><td class="num" data-age="${esc(s)}">–</td></tr>`).join("")}</tbody></table>`
      : `<div id="subs" class="empty">No subscriptions: messages published now are kept only for subscriptions created before.</div>`;
  };
  load();

  $("#publish").onsubmit = async (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const message = { data: b64encode(f.data.value) };
    const attrs = await act(async () => parseAttributes(f.attributes.value));
    if (!attrs) return;
    if (Object.keys(attrs).length) message.attributes = attrs;
    if (f.key.value) message.orderingKey = f.key.value;
    const copies = Math.max(1, Math.min(1000, Number(f.copies.value) || 1));
    const out = await act(() => api("POST", `/v1/${name}:publish`, { messages: Array(copies).fill(message) }));
    if (out) {
      toast(copies === 1 ? `published, message id ${out.messageIds[0]}` : `published ${copies} messages`);
      await poll();
    }
  };
  $("#edit").onsubmit = async (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const update = () => {
      const topic = { name, labels: f.labels.value.trim() ? parseAttributes(f.labels.value.replaceAll(",", "\n")) : {} };
      const mask = ["labels"];
      if (f.retention.value.trim()) { topic.messageRetentionDuration = f.retention.value.trim(); mask.push("messageRetentionDuration"); }
      return api("PATCH", `/v1/${name}`, { topic, updateMask: mask.join(",") });
    };
    if (await act(update, "topic updated")) load();
  };
  $("#delete").onclick = async () => {
    if (!confirm(`Delete topic ${id}?`)) return;
    if (await act(() => api("DELETE", `/v1/${name}`), `topic ${id} deleted`)) location.hash = "#/topics";
  };

  onLive(() => {
    const t = live.topics.get(name);
    if (t) {
      $("#published").textContent = fmt(num(t.messages));
      $("#rate").textContent = fmt(t.publishRate);
      $("#bytes").textContent = fmt(num(t.bytes));
      $("#rate-chart").innerHTML = spark(`${name}|publish`, "chart", 300, 46);
    }
    for (const el of main.querySelectorAll("[data-backlog]")) {
      const s = live.subs.get(el.dataset.backlog);
      el.textContent = s ? fmt(num(s.numUndeliveredMessages)) : "–";
    }
    for (const el of main.querySelectorAll("[data-age]")) {
      const s = live.subs.get(el.dataset.age);
      el.textContent = s ? age(s.oldestUnackedMessageAgeSeconds) : "–";
    }
    const sources = [...live.subs.values()].filter((s) => s.deadLetterTopic === name);
    $("#dlq").hidden = !sources.length;
    if (sources.length) {
      $("#dlq-body").innerHTML = `Messages that ${sources.map((s) => subLink(s.name)).join(", ")} could not deliver
        come here. Open a subscription of this topic above to browse them and send them back to their topic.`;
    }
  });
};

// --- subscriptions -------------------------------------------------------------------------------------------
views.subscriptions = (main) => {
  main.innerHTML = `
    <h1>Subscriptions</h1><div class="sub">in project <b>${esc(live.project)}</b></div>
    <div class="panel"><table>
      <thead><tr><th>Subscription</th><th>Topic</th><th class="num">Unacked</th><th></th><th class="num">Outstanding</th>
        <th class="num">Oldest unacked</th><th class="num">Delivered/s</th><th class="num">Acked/s</th><th></th></tr></thead>
      <tbody id="rows"><tr><td colspan="9" class="empty">loading…</td></tr></tbody></table></div>
    <div class="panel"><h2>Create a subscription</h2>
      <form class="grid" id="create-sub">
        <label>Subscription id</label><input name="id" required data-testid="sub-id">
        <label>Topic</label><select name="topic" required data-testid="sub-topic"></select>
        <label>Ack deadline (s)</label><input name="deadline" type="number" min="10" max="600" value="10">
        <label>Filter</label><input name="filter" placeholder='e.g. attributes.kind = "order"'>
        <label>Options</label><div class="row"><label class="check"><input type="checkbox" name="ordering"> ordering keys</label>
          <label class="check"><input type="checkbox" name="exactly"> exactly once</label>
          <label class="check"><input type="checkbox" name="retain"> retain acked</label></div>
        <label>Dead-letter topic</label><div class="row"><select name="dlq"><option value="">none</option></select>
          <input name="attempts" type="number" min="5" max="100" value="5" title="max delivery attempts"></div>
        <div class="actions"><button data-testid="create-sub">Create</button></div>
      </form></div>`;
  const f = $("#create-sub");
  const topics = [...live.topics.keys()].map(short);
  f.topic.innerHTML = topics.map((t) => `<option>${esc(t)}</option>`).join("");
  f.dlq.innerHTML += topics.map((t) => `<option>${esc(t)}</option>`).join("");
  f.onsubmit = async (ev) => {
    ev.preventDefault();
    const id = f.id.value.trim();
    const body = {
      topic: topicPath(f.topic.value), ackDeadlineSeconds: Number(f.deadline.value) || 10,
      enableMessageOrdering: f.ordering.checked, enableExactlyOnceDelivery: f.exactly.checked,
      retainAckedMessages: f.retain.checked,
    };
    if (f.filter.value.trim()) body.filter = f.filter.value.trim();
    if (f.dlq.value) body.deadLetterPolicy = { deadLetterTopic: topicPath(f.dlq.value), maxDeliveryAttempts: Number(f.attempts.value) || 5 };
    if (await act(() => api("PUT", `/v1/${subPath(id)}`, body), `subscription ${id} created`)) {
      f.id.value = "";
      await poll();
    }
  };
  onLive(() => {
    const rows = [...live.subs.values()];
    $("#rows").innerHTML = rows.length ? rows.map((s) => `
      <tr data-sub="${esc(short(s.name))}"><td>${subLink(s.name)}${s.deadLetterTopic ? ' <span class="tag dlq" title="has a dead-letter topic">DLQ</span>' : ""}${exportTag(s)}</td>
        <td>${topicLink(s.topic)}</td>
        <td class="num" data-testid="backlog">${fmt(num(s.numUndeliveredMessages))}</td><td>${spark(`${s.name}|backlog`)}</td>
        <td class="num">${fmt(num(s.numOutstandingMessages))}</td><td class="num">${age(s.oldestUnackedMessageAgeSeconds)}</td>
        <td class="num">${fmt(s.sendRate)}</td><td class="num">${fmt(s.ackRate)}</td>
        <td><button class="danger small" data-delete="${esc(short(s.name))}">Delete</button></td></tr>`).join("")
      : `<tr><td colspan="9" class="empty">No subscriptions in this project yet.</td></tr>`;
    for (const b of main.querySelectorAll("[data-delete]")) {
      b.onclick = async () => {
        const id = b.dataset.delete;
        if (!confirm(`Delete subscription ${id}? Its backlog is dropped.`)) return;
        if (await act(() => api("DELETE", `/v1/${subPath(id)}`), `subscription ${id} deleted`)) await poll();
      };
    }
  });
};

// an export subscription (cloud_storage_config, bigquery_config): where it writes and whether it runs; its lag is its
// unacked count and oldest unacked age, shown beside it
const exportTag = (s) => !s.export ? "" : `<span class="tag ${(s.exportState || "").startsWith("ACTIVE") ? "up" : "down"}"
  data-testid="export" title="${esc(`export to ${s.export}: ${s.exportState}; lag ${fmt(num(s.numUndeliveredMessages))} messages, oldest ${age(s.oldestUnackedMessageAgeSeconds)}`)}">export${(s.exportState || "").startsWith("ACTIVE") ? "" : " failing"}</span>`;

views.subscription = (main, id) => {
  const name = subPath(id);
  let config = null;
  main.innerHTML = `
    <h1>${esc(id)}</h1><div class="sub mono">${esc(name)}</div><div class="sub" id="export" data-testid="sub-export"></div>
    <div class="figures">
      <div class="figure"><div class="label">Unacked messages</div><div class="value" id="backlog" data-testid="sub-backlog">–</div><div id="backlog-chart"></div></div>
      <div class="figure"><div class="label">Oldest unacked</div><div class="value" id="age">–</div><div id="age-chart"></div></div>
      <div class="figure"><div class="label">Acked/s</div><div class="value" id="ack">–</div><div id="ack-chart"></div></div>
      <div class="figure"><div class="label">Outstanding</div><div class="value" id="outstanding">–</div><div id="outstanding-chart"></div></div>
    </div>
    <div class="panel"><h2>Messages</h2>
      <div class="toolbar">
        <form class="inline" id="pull"><input name="max" type="number" min="1" max="1000" value="10" style="width:80px">
          <label class="check"><input type="checkbox" name="ack"> acknowledge</label>
          <button data-testid="pull">Pull</button></form>
        <span class="grow"></span>
        <form class="inline" id="peek"><input name="id" placeholder="message id" style="width:220px"><button class="secondary">Peek</button></form>
      </div>
      <div id="messages" class="empty">Pull shows up to that many messages with their attributes; unless
        "acknowledge" is ticked they are handed back at once (a nack), so other subscribers get them.</div>
    </div>
    <div class="row">
      <div class="panel"><h2>Replay: seek</h2>
        <form class="grid" id="seek-time"><label>To a time</label><input name="time" type="datetime-local" step="1">
          <div class="actions"><button class="secondary">Seek</button></div></form>
        <form class="grid" id="seek-snap" style="margin-top:8px"><label>To a snapshot</label><select name="snap"></select>
          <div class="actions"><button class="secondary">Seek</button></div></form>
        <form class="grid" id="snap" style="margin-top:8px"><label>New snapshot</label><input name="id" placeholder="snapshot id">
          <div class="actions"><button class="secondary">Create snapshot</button></div></form>
      </div>
      <div class="panel"><h2>Configuration</h2><dl class="kv" id="config"></dl>
        <h2 style="margin-top:16px">Edit</h2>
        <form class="grid" id="edit">
          <label>Ack deadline (s)</label><input name="deadline" type="number" min="10" max="600">
          <label>Dead-letter topic</label><div class="row"><input name="dlq" placeholder="topic id (empty: none)">
            <input name="attempts" type="number" min="5" max="100" style="width:80px"></div>
          <label>Labels</label><input name="labels" placeholder="k=v, k2=v2">
          <div class="actions"><button class="secondary">Save</button>
            <button type="button" class="danger" id="delete">Delete subscription</button></div>
        </form></div>
    </div>`;

  const load = async () => {
    config = await act(() => api("GET", `/v1/${name}`));
    if (!config) return;
    const c = config;
    $("#config").innerHTML = [
      ["Topic", topicLink(c.topic)],
      ["Ack deadline", `${c.ackDeadlineSeconds || 10} s`],
      ["Delivery", c.pushConfig?.pushEndpoint ? `push to ${esc(c.pushConfig.pushEndpoint)}` : "pull"],
      ["Ordering keys", c.enableMessageOrdering ? "yes" : "no"],
      ["Exactly once", c.enableExactlyOnceDelivery ? "yes" : "no"],
      ["Filter", c.filter ? `<span class="mono">${esc(c.filter)}</span>` : "–"],
      ["Dead-letter topic", c.deadLetterPolicy?.deadLetterTopic ? `${topicLink(c.deadLetterPolicy.deadLetterTopic)} after ${c.deadLetterPolicy.maxDeliveryAttempts || 5} attempts` : "–"],
      ["Retain acked", c.retainAckedMessages ? "yes" : "no"],
      ["Labels", Object.entries(c.labels || {}).map(([k, v]) => `<span class="tag">${esc(k)}=${esc(v)}</span>`).join("") || "–"],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
    const f = $("#edit");
    f.deadline.value = c.ackDeadlineSeconds || 10;
    f.dlq.value = c.deadLetterPolicy?.deadLetterTopic ? short(c.deadLetterPolicy.deadLetterTopic) : "";
    f.attempts.value = c.deadLetterPolicy?.maxDeliveryAttempts || 5;
    f.labels.value = Object.entries(c.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    const snaps = await act(() => listAll(`/v1/projects/${live.project}/snapshots`, "snapshots"));
    const mine = (snaps || []).filter((s) => s.topic === c.topic);
    $("#seek-snap").snap.innerHTML = mine.length ? mine.map((s) => `<option value="${esc(s.name)}">${esc(short(s.name))}</option>`).join("")
      : `<option value="">no snapshot of this topic</option>`;
  };
  load();

  const showMessages = (received, acked) => {
    const box = $("#messages");
    if (!received.length) { box.className = "empty"; box.textContent = "No messages to deliver now."; return; }
    box.className = "";
    box.innerHTML = `<table><thead><tr><th>Message id</th><th>Published</th><th>Data</th><th>Attributes</th>
      <th>Ordering key</th><th class="num">Attempt</th><th></th></tr></thead><tbody>${received.map((r, i) => {
        const m = r.message;
        const attrs = Object.entries(m.attributes || {});
        const dead = m.attributes?.CloudPubSubDeadLetterSourceSubscription;
        return `<tr data-testid="message"><td class="mono">${esc(m.messageId)}</td><td>${esc((m.publishTime || "").replace("T", " ").replace(/\.\d+Z$/, "Z"))}</td>
          <td class="mono" data-testid="message-data">${esc(b64decode(m.data))}</td>
          <td>${attrs.map(([k, v]) => `<span class="tag">${esc(k)}=${esc(v)}</span>`).join("") || "–"}</td>
          <td>${esc(m.orderingKey || "–")}</td><td class="num">${esc(r.deliveryAttempt || "–")}</td>
          <td>${acked ? "acked" : dead ? `<button class="small" data-resend="${i}" title="publish it again to the topic of ${esc(dead)} and acknowledge it here">Send back</button>` : ""}</td></tr>`;
      }).join("")}</tbody></table>`;
    for (const b of box.querySelectorAll("[data-resend]")) {
      b.onclick = () => sendBack(received[Number(b.dataset.resend)], b);
    }
  };

  // a dead-lettered message back to the topic of the subscription it came from: published again (without the
  // dead-letter attributes), then acknowledged here
  const sendBack = async (r, button) => {
    const m = r.message;
    const a = { ...m.attributes };
    const src = `projects/${a.CloudPubSubDeadLetterSourceSubscriptionProject || live.project}/subscriptions/${a.CloudPubSubDeadLetterSourceSubscription}`;
    for (const k of Object.keys(a)) if (k.startsWith("CloudPubSubDeadLetter")) delete a[k];
    button.disabled = true;
    const ok = await act(async () => {
      const sub = await api("GET", `/v1/${src}`);
      const msg = { data: m.data || "", attributes: a };
      if (m.orderingKey) msg.orderingKey = m.orderingKey;
      // take it again (the pull that showed it handed it back) and ack that delivery after the publish is durable
      const taken = await api("POST", `/v1/${name}:pull`, { maxMessages: 1000, returnImmediately: true });
      const mine = (taken.receivedMessages || []).filter((x) => x.message.messageId === m.messageId);
      const others = (taken.receivedMessages || []).filter((x) => x.message.messageId !== m.messageId).map((x) => x.ackId);
      if (others.length) await api("POST", `/v1/${name}:modifyAckDeadline`, { ackIds: others, ackDeadlineSeconds: 0 });
      if (!mine.length) throw new ApiError({ message: "the message is no longer available here (acked, or taken by another subscriber)" });
      await api("POST", `/v1/${sub.topic}:publish`, { messages: [msg] });
      await api("POST", `/v1/${name}:acknowledge`, { ackIds: mine.map((x) => x.ackId) });
      return true;
    }, `message ${m.messageId} sent back to ${short(src)}'s topic`);
    button.textContent = ok ? "sent back" : "Send back";
    button.disabled = !!ok;
    await poll();
  };

  $("#pull").onsubmit = async (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const got = await act(() => api("POST", `/v1/${name}:pull`, { maxMessages: Number(f.max.value) || 10, returnImmediately: true }));
    if (!got) return;
    const received = got.receivedMessages || [];
    const ackIds = received.map((r) => r.ackId);
    if (ackIds.length) {
      if (f.ack.checked) await act(() => api("POST", `/v1/${name}:acknowledge`, { ackIds }));
      else await act(() => api("POST", `/v1/${name}:modifyAckDeadline`, { ackIds, ackDeadlineSeconds: 0 }));
    }
    showMessages(received, f.ack.checked);
    await poll();
  };
  $("#peek").onsubmit = async (ev) => {
    ev.preventDefault();
    const mid = ev.target.id.value.trim();
    if (!mid) return;
    const p = await act(() => api("GET", `/v1/${name}/messages/${encodeURIComponent(mid)}`));
    if (!p) return;
    showMessages([{ message: p.message, deliveryAttempt: p.deliveryAttempt }], false);
    toast(`message ${mid}: ${p.state}${p.activateAtMs && p.activateAtMs !== "0" ? `, due ${new Date(Number(p.activateAtMs)).toLocaleString()}` : ""}`);
  };
  $("#seek-time").onsubmit = async (ev) => {
    ev.preventDefault();
    const v = ev.target.time.value;
    if (!v) return;
    const time = new Date(v).toISOString();
    if (await act(() => api("POST", `/v1/${name}:seek`, { time }), `sought to ${time}`)) await poll();
  };
  $("#seek-snap").onsubmit = async (ev) => {
    ev.preventDefault();
    const snapshot = ev.target.snap.value;
    if (!snapshot) return;
    if (await act(() => api("POST", `/v1/${name}:seek`, { snapshot }), `sought to ${short(snapshot)}`)) await poll();
  };
  $("#snap").onsubmit = async (ev) => {
    ev.preventDefault();
    const sid = ev.target.id.value.trim();
    if (sid && await act(() => api("PUT", `/v1/projects/${live.project}/snapshots/${sid}`, { subscription: name }), `snapshot ${sid} created`)) {
      ev.target.reset();
      load();
    }
  };
  $("#edit").onsubmit = async (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const update = () => {
      const subscription = {
        name, ackDeadlineSeconds: Number(f.deadline.value) || 10,
        labels: f.labels.value.trim() ? parseAttributes(f.labels.value.replaceAll(",", "\n")) : {},
      };
      if (f.dlq.value.trim()) subscription.deadLetterPolicy = { deadLetterTopic: topicPath(f.dlq.value.trim()), maxDeliveryAttempts: Number(f.attempts.value) || 5 };
      return api("PATCH", `/v1/${name}`, { subscription, updateMask: "ackDeadlineSeconds,labels,deadLetterPolicy" });
    };
    if (await act(update, "subscription updated")) load();
  };
  $("#delete").onclick = async () => {
    if (!confirm(`Delete subscription ${id}?`)) return;
    if (await act(() => api("DELETE", `/v1/${name}`), `subscription ${id} deleted`)) location.hash = "#/subscriptions";
  };

  onLive(() => {
    const s = live.subs.get(name);
    if (!s) return;
    $("#backlog").textContent = fmt(num(s.numUndeliveredMessages));
    $("#age").textContent = age(s.oldestUnackedMessageAgeSeconds);
    $("#export").innerHTML = s.export ? `${exportTag(s)} ${esc(s.export)} — ${esc(s.exportState)}; export lag: the unacked
      messages and the oldest's age above` : "";
    $("#ack").textContent = fmt(s.ackRate);
    $("#outstanding").textContent = fmt(num(s.numOutstandingMessages));
    $("#backlog-chart").innerHTML = spark(`${name}|backlog`, "chart", 300, 46);
    $("#age-chart").innerHTML = spark(`${name}|age`, "chart", 300, 46);
    $("#ack-chart").innerHTML = spark(`${name}|ack`, "chart", 300, 46);
    $("#outstanding-chart").innerHTML = spark(`${name}|outstanding`, "chart", 300, 46);
  });
};

// --- snapshots ------------------------------------------------------------------------------------------------
views.snapshots = (main) => {
  main.innerHTML = `<h1>Snapshots</h1><div class="sub">in project <b>${esc(live.project)}</b> — create one from a subscription's page</div>
    <div class="panel"><div id="snaps" class="empty">loading…</div></div>`;
  const load = async () => {
    const snaps = await act(() => listAll(`/v1/projects/${live.project}/snapshots`, "snapshots"));
    if (!snaps) return;
    $("#snaps").outerHTML = snaps.length ? `<table id="snaps"><thead><tr><th>Snapshot</th><th>Topic</th><th>Expires</th><th></th></tr></thead><tbody>${
      snaps.map((s) => `<tr><td>${esc(short(s.name))}</td><td>${topicLink(s.topic)}</td><td>${esc(s.expireTime || "–")}</td>
        <td><button class="danger small" data-delete="${esc(short(s.name))}">Delete</button></td></tr>`).join("")}</tbody></table>`
      : `<div id="snaps" class="empty">No snapshots in this project.</div>`;
    for (const b of main.querySelectorAll("[data-delete]")) {
      b.onclick = async () => {
        if (await act(() => api("DELETE", `/v1/projects/${live.project}/snapshots/${b.dataset.delete}`), "snapshot deleted")) load();
      };
    }
  };
  load();
};

// --- the cluster --------------------------------------------------------------------------------------------------
const PALETTE = ["#3563e9", "#1a7f4b", "#b26b00", "#8e44ad", "#c0362c", "#0f8a8a", "#5d6d7e", "#d35400"];

views.cluster = (main) => {
  main.innerHTML = `<h1>Cluster</h1><div class="sub" id="cluster-sub">loading…</div><div id="cluster"></div>`;
  const load = async () => {
    let c;
    try { c = await api("GET", "/v1/cluster"); } catch (e) { $("#cluster-sub").textContent = e.message; return; }
    if (!c.clustered) {
      $("#cluster-sub").textContent = "This node runs on its own (the embedded default: no etcd, one data directory).";
      $("#cluster").innerHTML = `<div class="panel"><dl class="kv"><dt>Bundles</dt><dd>${fmt(c.bundles)}, all served here</dd></dl></div>`;
      return;
    }
    const nodes = c.nodes || [];
    const color = new Map(nodes.map((n, i) => [n.node, PALETTE[i % PALETTE.length]]));
    const owners = c.owners || {};
    $("#cluster-sub").textContent = `${c.region ? `region ${c.region} · ` : ""}cluster ${c.clusterId} · answered by ${c.answeredBy}`;
    const regions = c.regions || [];
    $("#cluster").innerHTML = `
      <div class="figures">
        <div class="figure"><div class="label">Nodes up</div><div class="value">${nodes.filter((n) => n.state === "up").length} / ${nodes.length}</div></div>
        <div class="figure"><div class="label">Bundles without owner</div><div class="value">${fmt(c.unowned || 0)} / ${fmt(c.bundles)}</div></div>
        <div class="figure"><div class="label">Ledgers (open)</div><div class="value">${fmt(num(c.ledgers?.total))} (${fmt(num(c.ledgers?.open))})</div></div>
        <div class="figure"><div class="label">Under-replicated ledgers</div><div class="value">${fmt(num(c.ledgers?.underReplicated))}</div></div>
      </div>
      ${regions.length ? `<div class="panel"><h2>Regions</h2><table><thead><tr><th>Region</th><th class="num">Slot</th><th>Reached at</th><th class="num">Round trip</th></tr></thead><tbody>${
        regions.map((r) => `<tr><td>${esc(r.region)}${r.region === c.region ? " (this one)" : ""}${r.lost ? ' <span class="tag down">lost</span>' : ""}</td><td class="num">${fmt(r.slot || 0)}</td>
          <td class="mono">${r.region === c.region ? "–" : r.lost ? "lost for good: its copies serve" : esc((r.gateways || []).join(", ") || "none: cut off or down")}</td>
          <td class="num">${r.roundTripMs ? `${r.roundTripMs.toFixed(1)} ms` : "–"}</td></tr>`).join("")}</tbody></table></div>` : ""}
      <div class="panel"><h2>Nodes</h2><table><thead><tr><th>Node</th><th>Address</th><th>Zone</th><th>State</th><th class="num">Bundles</th></tr></thead><tbody>${
        nodes.map((n) => `<tr><td><i style="display:inline-block;width:10px;height:10px;border-radius:2px;background:${color.get(n.node)}"></i> ${esc(n.node)}</td>
          <td class="mono">${esc(n.address)}</td><td>${esc(n.zone || "–")}</td><td><span class="tag ${esc(n.state)}">${esc(n.state)}</span></td>
          <td class="num">${fmt(n.bundles || 0)}</td></tr>`).join("")}</tbody></table></div>
      <div class="panel"><h2>Bundles → owners</h2><div class="bundles">${
        Array.from({ length: c.bundles }, (_, b) => {
          const o = owners[b];
          return `<div title="bundle ${b}: ${esc(o || "no owner")}" style="background:${o ? color.get(o) || "#999" : "#d0d5dd"}">${b}</div>`;
        }).join("")}</div></div>`;
  };
  load();
  const timer = setInterval(load, POLL_MS * 2);
  return () => clearInterval(timer);
};

// --- signing in ---------------------------------------------------------------------------------------------
// A call answered 401 (no token, or one the node no longer takes): forget what was shown, ask for a token. Calls
// made with a token since replaced say nothing.
function askToSignIn(message, used) {
  if (used !== auth.token()) return;
  if (used) sessionStorage.removeItem(TOKEN_KEY);
  auth.signedOut = true;
  Object.assign(live, { topics: new Map(), subs: new Map(), lastPoll: 0 });
  live.history.clear();
  $("#main").innerHTML = "";
  $("#status").textContent = "";
  $("#signin-why").textContent = used ? `The node refused the token: ${message}` : message;
  $("#who").hidden = true;
  $("#signin").hidden = false;
  $("#signin-form").token.focus();
}

function signIn(ev) {
  ev.preventDefault();
  const token = ev.target.token.value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  ev.target.reset();
  boot();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  $("#who").hidden = true;
  boot(); // a node that needs credentials answers 401: the prompt
}

// --- start ----------------------------------------------------------------------------------------------------
async function setProject(p) {
  live.project = p;
  localStorage.setItem("pigeon.project", p);
  $("#project").value = p;
  live.topics = new Map();
  live.subs = new Map();
  live.lastPoll = 0;
  await poll();
}

// the projects, then the view the address names; again after each sign-in
async function boot() {
  let projects = [];
  try { projects = (await api("GET", "/v1/projects")).projects || []; } catch (e) {
    if (e.code === 401) return; // the sign-in prompt is up
    toast(e.message, true);
  }
  auth.signedOut = false;
  $("#signin").hidden = true;
  $("#who").hidden = !auth.token();
  const ids = projects.map(short);
  $("#projects").innerHTML = ids.map((p) => `<option value="${esc(p)}">`).join("");
  const wanted = new URLSearchParams(location.search).get("project") || localStorage.getItem("pigeon.project");
  await setProject(wanted || ids[0] || "my-project");
  route();
}

function start() {
  $("#project").onchange = async (ev) => {
    const p = ev.target.value.trim();
    if (p && p !== live.project) { await setProject(p); route(); }
  };
  $("#signin-form").onsubmit = signIn;
  $("#signout").onclick = signOut;
  window.addEventListener("hashchange", route);
  setInterval(poll, POLL_MS);
  boot();
}

start();
