// The fleet console: a world map with this edge site and every region, the workers' live
// state, and the router's decisions as arrows from the site to the region each one chose,
// coloured by the signal that decided it.
//
// Fed by one server-sent-events stream (/console/events, the session cookie; no polling):
//   view       the router's view, every second (regions, workers, saturation)
//   decisions  decisions since the last message (site → region, deciding signal, runner-up)
//   events     ejections, workers down/draining/recovered, rejections, migrations
//   stats      what the edge dropped for this page because it read too slowly
//   status     the router's feed is unreachable / back
//   session    the session ended (sign in again)
// The map's geometry (world.json) is Natural Earth's land in an equirectangular projection:
// a place at (lat, lon) is drawn at x = lon, y = -lat.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const SHARE_WINDOW_MS = 5000;
  const MAX_ARROWS = 80;
  const MAX_EVENTS = 200;
  const SIGNALS = ["latency", "queue", "load", "kv-cache", "throughput", "prefix-affinity", "session-affinity", "loss", "gpu", "region-proximity"];
  const $ = (id) => document.getElementById(id);
  const svg = (tag, attrs = {}) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  };
  const el = (tag, props = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c != null) node.append(c);
    return node;
  };
  const fmt = (n, d = 0) => (n == null || !Number.isFinite(n) ? "–" : n.toFixed(d));
  const pct = (n) => (n == null || !Number.isFinite(n) ? "–" : `${Math.round(n * 100)} %`);
  const sigClass = (s) => `sig-${SIGNALS.includes(s) ? s : "other"}`;

  const view = { site: null, regions: new Map(), frame: null, world: [-180, -85, 360, 145], fit: true };
  const recent = []; // {at, region} of decisions drawn, for the share panel

  // --- map -----------------------------------------------------------------------------------

  async function loadMap() {
    try {
      const resp = await fetch("/static/world.json");
      const world = await resp.json();
      $("land").setAttribute("d", world.land);
      view.world = world.viewBox;
      frame();
    } catch (_) {
      /* no map geometry: places and arrows still draw on the blank sea */
    }
  }

  // The map frames the site and every region (the Pacific included: longitudes are taken
  // relative to the site, and the land is drawn three times, 360° apart); "World" shows all.
  const unwrap = (lon) => {
    const base = view.site && view.site.lon != null ? view.site.lon : 0;
    return base + ((((lon - base + 540) % 360) + 360) % 360) - 180;
  };
  const xy = (place) => [view.fit ? unwrap(place.lon) : place.lon, -place.lat];
  let scale = 1;

  function frame() {
    const [wx, wy, ww, wh] = view.world;
    const places = [view.site, ...view.regions.values()].filter((p) => p && p.lat != null);
    let box = [wx, wy, ww, wh];
    if (view.fit && places.length >= 2) {
      const xs = places.map((p) => xy(p)[0]);
      const ys = places.map((p) => xy(p)[1]);
      let w = Math.max(40, Math.max(...xs) - Math.min(...xs) + 30);
      let h = Math.max(20, Math.max(...ys) - Math.min(...ys) + 24);
      const aspect = ww / wh;
      if (w / h > aspect) h = w / aspect;
      else w = h * aspect;
      w = Math.min(w, ww);
      h = Math.min(h, wh);
      const cx = (Math.max(...xs) + Math.min(...xs)) / 2;
      const cy = Math.min(Math.max((Math.max(...ys) + Math.min(...ys)) / 2, wy + h / 2), wy + wh - h / 2);
      box = [cx - w / 2, cy - h / 2, w, h];
    }
    scale = box[2] / ww;
    $("map").setAttribute("viewBox", box.map((n) => n.toFixed(2)).join(" "));
    $("fit").textContent = view.fit ? "World" : "Fit the fleet";
  }

  function drawSite(site) {
    const g = $("site");
    g.replaceChildren();
    $("site-name").textContent = site ? `— site ${site.name}` : "";
    if (!site || site.lat == null) return;
    const [x, y] = xy(site);
    const a = 2.2 * scale;
    const mark = svg("rect", { x: x - a, y: y - a, width: 2 * a, height: 2 * a, class: "site", "data-site": site.name });
    mark.append(svg("title"));
    mark.firstChild.textContent = `edge site ${site.name}`;
    const label = svg("text", { x: x + 3 * scale, y: y + 5.5 * scale, "font-size": 3.6 * scale });
    label.textContent = site.name;
    g.append(mark, label);
  }

  function regionClass(r) {
    if (!r.live) return "down";
    return r.saturated ? "saturated" : "ok";
  }

  function drawRegions(regions) {
    const g = $("regions");
    g.replaceChildren();
    for (const r of regions) {
      if (r.lat == null) continue;
      const [x, y] = xy(r);
      const cls = regionClass(r);
      const load = r.load == null ? 0 : Math.min(1, r.load);
      const ring = svg("circle", { cx: x, cy: y, r: (3 + load * 3) * scale, class: `region-ring ${cls}`, "stroke-width": 0.8 * scale });
      const dot = svg("circle", { cx: x, cy: y, r: 2.4 * scale, class: `region ${cls}`, "data-region": r.name, "data-state": cls, tabindex: 0, "stroke-width": 0.8 * scale });
      const tip = svg("title");
      tip.textContent = `${r.name}: ${r.live} live worker(s), load ${pct(r.load)}, RTT ${fmt(r.rtt_ms, 1)} ms${r.saturated ? ", SATURATED" : ""}`;
      dot.append(tip);
      const label = svg("text", { x: x + 3.4 * scale, y: y - 2.4 * scale, "font-size": 3.6 * scale, "stroke-width": 0.9 * scale });
      label.textContent = `${r.name}${r.saturated ? " ⚠" : ""} ${fmt(r.rtt_ms, 0)} ms`;
      g.append(ring, dot, label);
    }
  }

  function arrow(d) {
    const site = view.site;
    const region = view.regions.get(d.region);
    if (!site || site.lat == null || !region || region.lat == null) return;
    const [x1, y1] = xy(site);
    const [x2, y2] = xy(region);
    const dx = x2 - x1;
    const dy = y2 - y1;
    const dist = Math.hypot(dx, dy);
    let path;
    if (dist < 1.5 * scale) {
      // The region is at the site: a small loop.
      path = `M${x1} ${y1} c ${4 * scale} ${-7 * scale}, ${9 * scale} ${-3 * scale}, ${dx} ${dy}`;
    } else {
      const bend = Math.min(20, dist * 0.3);
      const mx = (x1 + x2) / 2 - (dy / dist) * bend;
      const my = (y1 + y2) / 2 + (dx / dist) * bend;
      path = `M${x1} ${y1} Q${mx} ${my} ${x2} ${y2}`;
    }
    const line = svg("path", { d: path, class: `arrow ${sigClass(d.signal)}`, "data-region": d.region, "data-signal": d.signal || "", "stroke-width": 0.9 * scale });
    const tip = svg("title");
    tip.textContent = `${d.worker} (${d.region}) by ${d.signal}${d.runner_up ? ` over ${d.runner_up} (${d.runner_up_region})` : ""}`;
    line.append(tip);
    const layer = $("arrows");
    layer.append(line);
    while (layer.childElementCount > MAX_ARROWS) layer.firstElementChild.remove();
    requestAnimationFrame(() => requestAnimationFrame(() => line.classList.add("fade")));
    setTimeout(() => line.remove(), 1800);
  }

  function drawLegend() {
    $("legend").replaceChildren(...SIGNALS.map((s) => el("span", { class: sigClass(s), text: s })));
  }

  // --- panels --------------------------------------------------------------------------------

  function drawShare() {
    const now = Date.now();
    while (recent.length && recent[0].at < now - SHARE_WINDOW_MS) recent.shift();
    const counts = new Map();
    for (const r of recent) counts.set(r.region, (counts.get(r.region) || 0) + 1);
    const names = [...new Set([...view.regions.keys(), ...counts.keys()])].sort();
    const total = recent.length;
    $("share").replaceChildren(
      ...names.map((name) => {
        const n = counts.get(name) || 0;
        const share = total ? n / total : 0;
        const meter = el("meter", { min: "0", max: "1", value: String(share) });
        meter.setAttribute("aria-label", `${name} share`);
        return el("li", { "data-region": name, "data-share": share.toFixed(3), "data-count": String(n) }, el("span", { text: name }), meter, el("span", { text: `${Math.round(share * 100)} %` }));
      }),
    );
    $("rate").textContent = `${(total / (SHARE_WINDOW_MS / 1000)).toFixed(1)} decisions/s`;
  }

  function drawWorkers(workers) {
    $("workers").replaceChildren(
      ...workers.map((w) =>
        el(
          "tr",
          { "data-worker": w.id, "data-state": w.state, "data-saturated": String(w.saturated) },
          el("th", { scope: "row", text: w.id }),
          el("td", { text: w.region }),
          el("td", {}, el("span", { class: `state ${w.state}`, text: w.state }), w.saturated ? el("span", { class: "sat", text: " saturated" }) : null),
          el("td", { text: w.rtt_ms == null ? "–" : `${fmt(w.rtt_ms, 1)} ms` }),
          el("td", { text: pct(w.loss) }),
          el("td", { text: String(w.waiting) }),
          el("td", { "data-running": String(w.running), text: `${w.running} / ${w.max_running}` }),
          el("td", { text: String(w.in_flight) }),
          el("td", { text: pct(w.kv_cache) }),
          el("td", { text: pct(w.load) }),
          el("td", { text: fmt(w.tokens_per_s, 0) }),
          el("td", { text: w.gpu == null ? "n/a" : pct(w.gpu) }),
          el("td", { text: w.filtered_by ? `${w.filtered_by}: ${w.filtered_reason}` : w.detail }),
        ),
      ),
    );
  }

  function describeEvent(e) {
    const when = new Date(e.at).toLocaleTimeString();
    if (e.worker) return [when, e.kind, `${e.worker} (${e.region}) ${e.from} → ${e.kind}${e.detail && e.detail !== "ok" ? `: ${e.detail}` : ""}`];
    const who = e.by === "router" ? `router: ${e.reason}${e.priority ? ` (${e.priority} tier)` : ""}` : `edge: ${e.reason.replaceAll("_", " ")}`;
    return [when, e.kind, `${who} × ${e.count}`];
  }

  function addEvents(events) {
    const list = $("events");
    for (const e of events) {
      const [when, kind, text] = describeEvent(e);
      list.prepend(el("li", { "data-kind": e.kind }, el("span", { class: "status", text: `${when} ` }), el("span", { class: `kind ${e.kind}`, text: kind }), document.createTextNode(` ${text}`)));
    }
    while (list.childElementCount > MAX_EVENTS) list.lastElementChild.remove();
  }

  function banner(text) {
    const b = $("banner");
    b.textContent = text || "";
    b.hidden = !text;
  }

  // --- the stream ----------------------------------------------------------------------------

  function connect() {
    const source = new EventSource("/console/events");
    const conn = $("conn");
    source.onopen = () => {
      conn.textContent = "live";
    };
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        conn.textContent = "disconnected";
        banner("The event stream was refused or closed. Reload the page (you may need to sign in again).");
      } else {
        conn.textContent = "reconnecting…";
      }
    };
    source.addEventListener("view", (m) => {
      const v = JSON.parse(m.data);
      const placed = (list) => list.filter((p) => p && p.lat != null).map((p) => `${p.name}@${p.lat},${p.lon}`).join(";");
      const before = placed([view.site, ...view.regions.values()]);
      view.site = v.site;
      view.regions = new Map(v.regions.map((r) => [r.name, r]));
      if (placed([view.site, ...view.regions.values()]) !== before) frame();
      drawSite(v.site);
      drawRegions(v.regions);
      drawWorkers(v.workers);
      drawShare();
      document.body.dataset.viewAt = String(v.generated_unix_ms);
    });
    source.addEventListener("decisions", (m) => {
      const now = Date.now();
      for (const d of JSON.parse(m.data)) {
        if (d.rejected) continue;
        recent.push({ at: now, region: d.region });
        arrow(d);
      }
      drawShare();
    });
    source.addEventListener("events", (m) => addEvents(JSON.parse(m.data)));
    source.addEventListener("stats", (m) => {
      const s = JSON.parse(m.data);
      $("stats").textContent = `This page read too slowly for ${s.dropped_decisions} decisions and ${s.dropped_events} events (dropped), ${s.coalesced_views} views (merged).`;
    });
    source.addEventListener("status", (m) => {
      const s = JSON.parse(m.data);
      banner(s.router === "ok" ? "" : `The router's feed is unreachable: ${s.detail || ""} — retrying.`);
    });
    source.addEventListener("session", () => {
      source.close();
      conn.textContent = "signed out";
      banner("The console session ended. Reload the page to sign in again.");
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    drawLegend();
    $("fit").addEventListener("click", () => {
      view.fit = !view.fit;
      frame();
      drawSite(view.site);
      drawRegions([...view.regions.values()]);
    });
    loadMap();
    connect();
    setInterval(drawShare, 1000);
  });
})();
