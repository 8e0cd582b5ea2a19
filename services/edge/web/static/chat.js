// Meridian's chat page. Everything stays in the browser: the API key in this tab's session
// storage (never in a URL, never logged), conversations in local storage. The page talks to
// this edge's OpenAI-compatible API only: /v1/models, /v1/chat/completions (streamed, read
// with fetch so that Stop aborts the request — the edge then cancels the generation on the
// worker), and /v1/explanations/{request_id} for the router's reasons.
//
// Model output is rendered by markdown.js (escaped raw HTML, DOMPurify, Trusted Types).
// Every other string reaches the DOM through textContent.
"use strict";

(() => {
  const KEY_STORE = "meridian.apiKey";
  const CONV_STORE = "meridian.conversations";
  const MAX_CONVERSATIONS = 50;
  const $ = (id) => document.getElementById(id);
  const el = (tag, props = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) if (c != null) node.append(c);
    return node;
  };

  const state = {
    key: sessionStorage.getItem(KEY_STORE) || "",
    conversations: loadConversations(),
    current: null,
    controller: null,
    streaming: false,
  };

  function loadConversations() {
    try {
      const list = JSON.parse(localStorage.getItem(CONV_STORE) || "[]");
      return Array.isArray(list) ? list : [];
    } catch (_) {
      return [];
    }
  }

  function saveConversations() {
    state.conversations = state.conversations.slice(0, MAX_CONVERSATIONS);
    try {
      localStorage.setItem(CONV_STORE, JSON.stringify(state.conversations));
    } catch (_) {
      /* storage full or disabled: the conversation lives until the tab closes */
    }
  }

  // --- errors, as a person wants them ------------------------------------------------------

  function describeError(status, body, headers) {
    const err = (body && body.error) || {};
    const message = err.message || `HTTP ${status}`;
    const retry = headers ? Number(headers.get("Retry-After")) : NaN;
    const wait = Number.isFinite(retry) && retry > 0 ? ` Try again in ${retry} s.` : "";
    if (status === 401) {
      return { title: "The API key was not accepted (401).", text: `${message} Check the key, or paste another one.` };
    }
    if (status === 429) {
      return { title: "Slow down: rate limit reached (429).", text: `${message}${wait}`, retry };
    }
    if (status === 400 || status === 422) {
      const field = err.param ? ` (field: ${err.param})` : "";
      return { title: `The request was refused${field}.`, text: message };
    }
    if (status === 404) {
      return { title: "Not found (404).", text: message };
    }
    if (status === 503) {
      return { title: "No capacity right now (503).", text: `${message}${wait}`, retry };
    }
    return { title: `Something went wrong (${status}).`, text: message };
  }

  let retryTimer = null;
  function showError(problem) {
    const box = $("error");
    clearInterval(retryTimer);
    box.replaceChildren(el("strong", { text: problem.title }), el("span", { text: problem.text }));
    box.hidden = false;
    if (problem.retry > 0) {
      let left = Math.ceil(problem.retry);
      const count = el("span", { class: "countdown" });
      box.append(" ", count);
      const tick = () => {
        count.textContent = left > 0 ? `(${left} s)` : "(you can send again)";
        if (left-- <= 0) clearInterval(retryTimer);
      };
      tick();
      retryTimer = setInterval(tick, 1000);
    }
  }

  function clearError() {
    clearInterval(retryTimer);
    $("error").hidden = true;
    $("error").replaceChildren();
  }

  async function readJson(resp) {
    try {
      return await resp.json();
    } catch (_) {
      return null;
    }
  }

  // --- key and models ----------------------------------------------------------------------

  function authHeaders() {
    return { Authorization: `Bearer ${state.key}` };
  }

  async function useKey(key) {
    state.key = key.trim();
    const status = $("key-status");
    if (!state.key) {
      status.textContent = "Paste an API key first.";
      return;
    }
    status.className = "status";
    status.textContent = "Checking the key…";
    let resp;
    try {
      resp = await fetch("/v1/models", { headers: authHeaders(), cache: "no-store" });
    } catch (e) {
      status.textContent = "The edge did not answer; is it running?";
      return;
    }
    if (!resp.ok) {
      const problem = describeError(resp.status, await readJson(resp), resp.headers);
      status.textContent = problem.title;
      showError(problem);
      sessionStorage.removeItem(KEY_STORE);
      $("model").disabled = true;
      return;
    }
    clearError();
    sessionStorage.setItem(KEY_STORE, state.key);
    $("api-key").value = "";
    $("forget-key").hidden = false;
    const models = ((await readJson(resp)) || {}).data || [];
    const select = $("model");
    const previous = select.value || localStorage.getItem("meridian.model") || "";
    select.replaceChildren(
      ...models.map((m) => el("option", { value: m.id, text: `${m.id}  (${(m.regions || []).join(", ")})` })),
    );
    if (models.some((m) => m.id === previous)) select.value = previous;
    select.disabled = models.length === 0;
    status.className = "status ok";
    status.textContent = models.length
      ? `Key accepted. ${models.length} model${models.length > 1 ? "s" : ""} available.`
      : "Key accepted, but no model is being served right now.";
  }

  function forgetKey() {
    state.key = "";
    sessionStorage.removeItem(KEY_STORE);
    $("forget-key").hidden = true;
    $("model").disabled = true;
    $("key-status").className = "status";
    $("key-status").textContent = "Key forgotten. Paste an API key to chat.";
  }

  // --- conversations -----------------------------------------------------------------------

  function newConversation() {
    const conv = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New conversation", messages: [] };
    state.conversations.unshift(conv);
    state.current = conv;
    saveConversations();
    renderConversations();
    renderMessages();
    $("prompt").focus();
    return conv;
  }

  function renderConversations() {
    const list = $("conversations");
    list.replaceChildren(
      ...state.conversations.map((conv) => {
        const open = el("button", { type: "button", class: "open", text: conv.title });
        open.addEventListener("click", () => {
          if (state.streaming) return;
          state.current = conv;
          renderConversations();
          renderMessages();
        });
        const del = el("button", { type: "button", text: "✕", title: `Delete "${conv.title}"` });
        del.setAttribute("aria-label", `Delete conversation ${conv.title}`);
        del.addEventListener("click", () => {
          if (state.streaming) return;
          state.conversations = state.conversations.filter((c) => c !== conv);
          if (state.current === conv) state.current = state.conversations[0] || null;
          saveConversations();
          renderConversations();
          renderMessages();
        });
        const li = el("li", { class: conv === state.current ? "current" : "" }, open, del);
        return li;
      }),
    );
  }

  function renderMessages() {
    const box = $("messages");
    const conv = state.current;
    if (!conv || conv.messages.length === 0) {
      box.replaceChildren(el("p", { class: "empty", text: "Send a message to start. Under every reply: the region and worker that served it, how fast, and the router's reasons." }));
      return;
    }
    box.replaceChildren(...conv.messages.map((m, i) => messageView(m, i === conv.messages.length - 1)));
    box.scrollTop = box.scrollHeight;
  }

  // --- one message -------------------------------------------------------------------------

  function fmt(n, digits = 0) {
    return Number.isFinite(n) ? n.toFixed(digits) : "–";
  }

  function metaView(meta) {
    const items = [
      ["Region", meta.region || "–", "region"],
      ["Worker", meta.worker || "–", "worker"],
      ["Attempts", meta.attempts != null ? String(meta.attempts) : "–", "attempts"],
      ["Migrations", meta.migrations != null ? String(meta.migrations) : "0", "migrations"],
      ["TTFT", meta.ttft_ms != null ? `${fmt(meta.ttft_ms)} ms` : "–", "ttft"],
      ["Tokens/s", meta.tokens_per_s != null ? fmt(meta.tokens_per_s, 1) : "–", "tps"],
      ["Tokens in/out", `${meta.prompt_tokens ?? "–"} / ${meta.completion_tokens ?? "–"}`, "tokens"],
    ];
    const dl = el("dl", { class: "meta" });
    for (const [name, value, key] of items) {
      dl.append(el("div", { "data-meta": key }, el("dt", { text: name }), el("dd", { text: value })));
    }
    return dl;
  }

  function messageView(m, last) {
    const wrap = el("article", { class: `msg ${m.role}` });
    wrap.setAttribute("aria-label", m.role === "user" ? "You" : "Assistant");
    const bubble = el("div", { class: "bubble" });
    if (m.role === "assistant") {
      window.MeridianMarkdown.render(bubble, m.content || "");
      if (m.stopped) bubble.append(el("p", { class: "note", text: "Stopped." }));
      if (m.error) bubble.append(el("p", { class: "note", text: `The stream ended with an error: ${m.error}` }));
    } else {
      bubble.textContent = m.content;
    }
    wrap.append(bubble);
    if (m.role === "assistant" && m.meta) {
      wrap.append(metaView(m.meta));
      const actions = el("div", { class: "actions" });
      if (m.meta.request_id) {
        const why = el("button", { type: "button", class: "why-button", text: "Why here?" });
        why.setAttribute("aria-expanded", "false");
        why.addEventListener("click", () => toggleWhy(wrap, why, m.meta.request_id));
        actions.append(why);
      }
      if (last && !state.streaming) {
        const again = el("button", { type: "button", class: "regenerate", text: "Regenerate" });
        again.addEventListener("click", regenerate);
        actions.append(again);
      }
      wrap.append(actions);
    }
    return wrap;
  }

  // --- the router's explanation ------------------------------------------------------------

  async function toggleWhy(wrap, button, requestId) {
    const open = wrap.querySelector(".why");
    if (open) {
      open.remove();
      button.setAttribute("aria-expanded", "false");
      return;
    }
    const panel = el("section", { class: "why", text: "Asking the router…" });
    panel.setAttribute("aria-label", "Routing explanation");
    wrap.append(panel);
    button.setAttribute("aria-expanded", "true");
    let resp;
    try {
      resp = await fetch(`/v1/explanations/${encodeURIComponent(requestId)}`, { headers: authHeaders(), cache: "no-store" });
    } catch (_) {
      panel.textContent = "The edge did not answer.";
      return;
    }
    const body = await readJson(resp);
    if (!resp.ok) {
      const problem = describeError(resp.status, body, resp.headers);
      panel.replaceChildren(el("strong", { text: problem.title }), el("p", { text: problem.text }));
      return;
    }
    panel.replaceChildren(...explanationView(body));
    panel.focus();
  }

  function explanationView(body) {
    const out = [];
    (body.decisions || []).forEach((d, i) => {
      const head = i === 0 ? "Decision" : `Reroute ${i} (excluding ${d.excluded.join(", ")})`;
      out.push(el("p", {}, el("strong", { text: `${head}: ` }), document.createTextNode(d.explanation || d.empty_reason || "")));
      if (d.signal) {
        out.push(el("p", { "data-signal": d.signal }, document.createTextNode("Deciding signal: "), el("strong", { class: `sig-${d.signal}`, text: d.signal })));
      }
      if (d.candidates.length) {
        const signals = d.candidates[0].contributions.map((c) => c.signal);
        const head = el("tr", {}, el("th", { text: "worker" }), el("th", { text: "region" }), el("th", { text: "score" }), ...signals.map((s) => el("th", { text: s })));
        const rows = d.candidates.map((c, j) =>
          el(
            "tr",
            { class: j === 0 ? "winner" : "" },
            el("td", { text: c.worker }),
            el("td", { text: c.region }),
            el("td", { text: fmt(c.score, 3) }),
            ...c.contributions.map((s) => {
              const td = el("td", { text: `${fmt(s.weighted, 3)}` });
              td.title = `${s.signal}: score ${fmt(s.score, 3)} × weight ${s.weight}${s.detail ? ` — ${s.detail}` : ""}`;
              return td;
            }),
          ),
        );
        const table = el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
        table.setAttribute("aria-label", "Candidates and their per-signal contributions (weighted)");
        out.push(table);
        if (d.more_candidates) out.push(el("p", { text: `… and ${d.more_candidates} more candidates.` }));
      }
      if (d.filtered.length) {
        out.push(el("p", { text: "Left out by filters:" }));
        out.push(el("ul", {}, ...d.filtered.map((f) => el("li", { text: `${f.worker} (${f.region}) — ${f.filter}: ${f.reason}` }))));
      }
      out.push(el("p", { class: "status", text: `decision ${d.decision_id} at router ${d.router_site}, ${fmt(d.decision_us)} µs` }));
    });
    return out;
  }

  // --- sending and streaming ---------------------------------------------------------------

  function setStreaming(on) {
    state.streaming = on;
    $("send").disabled = on;
    $("stop").hidden = !on;
    $("new-chat").disabled = on;
  }

  function title(text) {
    const t = text.replace(/\s+/g, " ").trim();
    return t.length > 40 ? `${t.slice(0, 40)}…` : t || "New conversation";
  }

  async function send(text) {
    if (state.streaming) return;
    if (!state.key) {
      showError({ title: "No API key yet.", text: "Paste an API key in the box on the left first." });
      $("api-key").focus();
      return;
    }
    const model = $("model").value;
    if (!model) {
      showError({ title: "No model selected.", text: "Use a key that has models, then pick one." });
      return;
    }
    const conv = state.current || newConversation();
    if (text) {
      conv.messages.push({ role: "user", content: text });
      if (conv.messages.length === 1) conv.title = title(text);
    }
    localStorage.setItem("meridian.model", model);
    await complete(conv, model);
  }

  async function complete(conv, model) {
    clearError();
    const history = conv.messages.map(({ role, content }) => ({ role, content }));
    const reply = { role: "assistant", content: "", meta: { model } };
    conv.messages.push(reply);
    renderConversations();
    renderMessages();
    const view = $("messages").lastElementChild;
    view.classList.add("streaming");
    const bubble = view.querySelector(".bubble");
    setStreaming(true);
    const controller = new AbortController();
    state.controller = controller;
    const started = performance.now();
    let firstAt = null;
    let lastAt = null;
    let pending = false;
    const draw = () => {
      pending = false;
      window.MeridianMarkdown.render(bubble, reply.content);
      const box = $("messages");
      box.scrollTop = box.scrollHeight;
    };
    try {
      const resp = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { ...authHeaders(), "Content-Type": "application/json" },
        body: JSON.stringify({ model, messages: history, stream: true, stream_options: { include_usage: true } }),
        signal: controller.signal,
        cache: "no-store",
      });
      const meta = reply.meta;
      meta.request_id = resp.headers.get("x-request-id") || null;
      meta.region = resp.headers.get("x-meridian-region");
      meta.worker = resp.headers.get("x-meridian-worker");
      const attempts = resp.headers.get("x-meridian-attempts");
      meta.attempts = attempts ? Number(attempts) : null;
      if (!resp.ok) {
        const problem = describeError(resp.status, await readJson(resp), resp.headers);
        conv.messages.pop();
        showError(problem);
        return;
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          for (const line of frame.split("\n")) {
            if (!line.startsWith("data: ")) continue;
            const data = line.slice(6);
            if (data === "[DONE]") continue;
            let chunk;
            try {
              chunk = JSON.parse(data);
            } catch (_) {
              continue;
            }
            if (chunk.error) {
              reply.error = chunk.error.message || "unknown error";
              continue;
            }
            const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
            if (delta && delta.content) {
              const now = performance.now();
              if (firstAt === null) {
                firstAt = now;
                meta.ttft_ms = now - started;
              }
              lastAt = now;
              reply.content += delta.content;
              if (!pending) {
                pending = true;
                requestAnimationFrame(draw);
              }
            }
            if (chunk.usage) {
              meta.prompt_tokens = chunk.usage.prompt_tokens;
              meta.completion_tokens = chunk.usage.completion_tokens;
            }
            // Streams that migrated between workers say so in an extension object.
            const ext = chunk.meridian || chunk.x_meridian;
            if (ext && Number.isFinite(ext.migrations)) meta.migrations = ext.migrations;
            if (ext && ext.region) meta.region = ext.region;
            if (ext && ext.worker) meta.worker = ext.worker;
          }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") {
        reply.stopped = true;
      } else {
        reply.error = "the connection to the edge was lost";
      }
    } finally {
      state.controller = null;
      const meta = reply.meta;
      if (firstAt !== null && lastAt !== null && meta.completion_tokens > 1 && lastAt > firstAt) {
        meta.tokens_per_s = ((meta.completion_tokens - 1) * 1000) / (lastAt - firstAt);
      }
      setStreaming(false);
      saveConversations();
      renderMessages();
      $("prompt").focus();
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function regenerate() {
    const conv = state.current;
    if (!conv || state.streaming) return;
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role === "assistant") {
      conv.messages.pop();
    }
    if (!conv.messages.length) return;
    send("");
  }

  // --- wiring ------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      useKey($("api-key").value);
    });
    $("forget-key").addEventListener("click", forgetKey);
    $("new-chat").addEventListener("click", () => newConversation());
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("prompt").value.trim();
      if (!text) return;
      $("prompt").value = "";
      send(text);
    });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && state.streaming) stop();
    });
    $("stop").addEventListener("click", stop);
    state.current = state.conversations[0] || null;
    renderConversations();
    renderMessages();
    if (state.key) useKey(state.key);
  });
})();
