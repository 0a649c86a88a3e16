// The playground: every endpoint of the API in one page, with the key the user pastes.
// No framework and no build step. The key lives in this tab's sessionStorage and goes only
// into the Authorization header of same-origin calls; every text from the server is shown
// with textContent, never parsed as HTML.
"use strict";

const KEY_STORAGE = "serve-app.api-key";
const FILE_NAME = "playground.py";
const FIM_DEBOUNCE_MS = 40;
const FIM_MAX_TOKENS = 48;
const EDIT_PAUSE_MS = 600;
const EDIT_REGION_LINES = 6; // Continue's: the cursor line and the 5 after it
const EDIT_MAX_DIFFS = 6;
const LISTINGS = {
  fim: "/v1/fim/completions/models",
  edit: "/v1/edit/completions/models",
  apply: "/v1/apply/completions/models",
  decisions: "/v1/decisions/models",
  chat: "/v1/chat/completions/models",
};

const $ = (id) => document.getElementById(id);
const session = { key: sessionStorage.getItem(KEY_STORAGE) || "", models: {} };

// --- the API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

function requestInit(body, signal) {
  const headers = { Authorization: `Bearer ${session.key}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  return {
    method: body === undefined ? "GET" : "POST",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  };
}

async function parsedBody(response) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return { error: { message: text || response.statusText, type: "invalid_response" } };
  }
}

async function callApi(path, body, signal) {
  const response = await fetch(path, requestInit(body, signal));
  const parsed = await parsedBody(response);
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

// Server-sent events of a streamed answer: yields each chunk until `data: [DONE]`; an error
// event (a stream that failed after it began) is thrown as the contract's error object.
async function* streamApi(path, body, signal) {
  const response = await fetch(path, requestInit(body, signal));
  if (!response.ok) throw new ApiError(response.status, await parsedBody(response));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(response.status, chunk);
        yield chunk;
      }
    }
  }
}

function showError(element, error) {
  if (error === null) {
    element.hidden = true;
    element.textContent = "";
    return;
  }
  element.hidden = false;
  if (error instanceof ApiError) {
    const status = `HTTP ${error.status}`;
    element.textContent = `${status}\n${JSON.stringify(error.body, null, 2)}`;
  } else {
    element.textContent = String(error.message || error);
  }
}

const isAbort = (error) => error && error.name === "AbortError";

// --- the key and the models ------------------------------------------------------------

async function loadModels() {
  const status = $("key-status");
  if (!session.key) {
    status.textContent = "no key: held in this tab only, never in a URL";
    return;
  }
  status.textContent = "checking the key...";
  try {
    const lists = await Promise.all(
      Object.entries(LISTINGS).map(async ([endpoint, path]) => [endpoint, await callApi(path)]),
    );
    for (const [endpoint, list] of lists) {
      session.models[endpoint] = list.data.length ? list.data[0].id : null;
    }
    status.textContent = "key accepted (held in this tab only)";
  } catch (error) {
    session.models = {};
    status.textContent = error instanceof ApiError ? `key refused: ${error.message}` : String(error);
  }
  for (const span of document.querySelectorAll(".model")) {
    span.textContent = session.models[span.dataset.endpoint] || "(none)";
  }
}

function modelFor(endpoint) {
  const model = session.models[endpoint];
  if (!model) throw new Error(`No model for ${endpoint}: paste a key that may use one.`);
  return model;
}

function setupKey() {
  const input = $("api-key");
  $("use-key").addEventListener("click", () => {
    session.key = input.value.trim();
    input.value = "";
    sessionStorage.setItem(KEY_STORAGE, session.key);
    loadModels();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") $("use-key").click();
  });
  $("forget-key").addEventListener("click", () => {
    session.key = "";
    sessionStorage.removeItem(KEY_STORAGE);
    loadModels();
  });
}

function setupTabs() {
  const buttons = document.querySelectorAll("#tabs button");
  for (const button of buttons) {
    button.addEventListener("click", () => {
      for (const other of buttons) other.classList.toggle("active", other === button);
      for (const tab of document.querySelectorAll(".tab")) {
        tab.hidden = tab.id !== `tab-${button.dataset.tab}`;
      }
    });
  }
}

// --- line diffs ------------------------------------------------------------------------

// [kind, line] pairs, kind " ", "-" or "+": the common head and tail are cut first, then the
// longest common subsequence of what is left.
function lineDiff(before, after) {
  const a = before.split("\n");
  const b = after.split("\n");
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (
    tail < a.length - head && tail < b.length - head &&
    a[a.length - 1 - tail] === b[b.length - 1 - tail]
  ) tail++;
  const x = a.slice(head, a.length - tail);
  const y = b.slice(head, b.length - tail);
  const lengths = Array.from({ length: x.length + 1 }, () => new Array(y.length + 1).fill(0));
  for (let i = x.length - 1; i >= 0; i--) {
    for (let j = y.length - 1; j >= 0; j--) {
      lengths[i][j] = x[i] === y[j]
        ? lengths[i + 1][j + 1] + 1
        : Math.max(lengths[i + 1][j], lengths[i][j + 1]);
    }
  }
  const middle = [];
  let i = 0;
  let j = 0;
  while (i < x.length || j < y.length) {
    if (i < x.length && j < y.length && x[i] === y[j]) {
      middle.push([" ", x[i]]); i++; j++;
    } else if (i < x.length && (j === y.length || lengths[i + 1][j] >= lengths[i][j + 1])) {
      middle.push(["-", x[i]]); i++;
    } else {
      middle.push(["+", y[j]]); j++;
    }
  }
  return [
    ...a.slice(0, head).map((line) => [" ", line]),
    ...middle,
    ...a.slice(a.length - tail).map((line) => [" ", line]),
  ];
}

function renderDiff(element, rows, note) {
  element.replaceChildren();
  for (const [kind, line] of rows) {
    const span = document.createElement("span");
    span.className = kind === "+" ? "add" : kind === "-" ? "del" : "same";
    span.textContent = `${kind} ${line}`;
    element.append(span);
  }
  if (note) {
    const span = document.createElement("span");
    span.className = "note";
    span.textContent = note;
    element.append(span);
  }
}

// One hunk of a unified diff between two versions of the file (Continue's history entries).
function unifiedDiff(before, after, context = 2) {
  const rows = lineDiff(before, after);
  const changed = rows.map((row, index) => (row[0] === " " ? -1 : index)).filter((i) => i >= 0);
  if (!changed.length) return null;
  const start = Math.max(0, changed[0] - context);
  const end = Math.min(rows.length, changed[changed.length - 1] + context + 1);
  let oldStart = 1;
  let newStart = 1;
  for (const [kind] of rows.slice(0, start)) {
    if (kind !== "+") oldStart++;
    if (kind !== "-") newStart++;
  }
  const hunk = rows.slice(start, end);
  const oldCount = hunk.filter(([kind]) => kind !== "+").length;
  const newCount = hunk.filter(([kind]) => kind !== "-").length;
  const lines = hunk.map(([kind, line]) => `${kind}${line}`);
  const header = `@@ -${oldStart},${oldCount} +${newStart},${newCount} @@`;
  return [`--- ${FILE_NAME}`, `+++ ${FILE_NAME}`, header, ...lines].join("\n");
}

// --- FIM: ghost text in the code pane --------------------------------------------------

// A transparent textarea over a backdrop that draws its text with the suggestion at the caret.
class GhostEditor {
  constructor(root) {
    this.textarea = root.querySelector("textarea");
    this.backdrop = root.querySelector(".backdrop");
    this.ghost = "";
    this.anchor = -1;
    this.textarea.addEventListener("scroll", () => this.syncScroll());
    this.render();
  }

  get caret() {
    const { selectionStart, selectionEnd } = this.textarea;
    return selectionStart === selectionEnd ? selectionStart : -1;
  }

  show(ghost, at) {
    this.ghost = ghost;
    this.anchor = at;
    this.render();
  }

  clear() {
    if (!this.ghost) return;
    this.show("", -1);
  }

  // The text typed at the anchor matches the suggestion's start: keep the rest showing.
  typedAlong(inserted) {
    if (!this.ghost || !inserted || !this.ghost.startsWith(inserted)) return false;
    if (this.caret !== this.anchor + inserted.length) return false;
    this.show(this.ghost.slice(inserted.length), this.caret);
    return true;
  }

  accept() {
    const at = this.caret;
    if (!this.ghost || at !== this.anchor) return false;
    const text = this.ghost;
    this.show("", -1);
    this.textarea.setRangeText(text, at, at, "end");
    this.render();
    return true;
  }

  render() {
    const value = this.textarea.value;
    const at = this.ghost && this.caret === this.anchor ? this.anchor : value.length;
    const ghost = document.createElement("span");
    ghost.className = "ghost";
    ghost.textContent = at === this.anchor ? this.ghost : "";
    // The trailing newline keeps a last empty line as tall as the textarea's.
    this.backdrop.replaceChildren(value.slice(0, at), ghost, `${value.slice(at)}\n`);
    this.syncScroll();
  }

  syncScroll() {
    this.backdrop.scrollTop = this.textarea.scrollTop;
    this.backdrop.scrollLeft = this.textarea.scrollLeft;
  }
}

function setupFim() {
  const editor = new GhostEditor($("fim-editor"));
  const stats = $("fim-stats");
  const error = $("fim-error");
  let timer = null;
  let inFlight = null;
  let sequence = 0;

  const cancel = () => {
    clearTimeout(timer);
    if (inFlight) inFlight.abort();
    inFlight = null;
  };

  async function suggest(typedAt) {
    const at = editor.caret;
    if (at < 0) return;
    const value = editor.textarea.value;
    const body = {
      model: modelFor("fim"),
      prompt: value.slice(0, at),
      suffix: value.slice(at),
      max_tokens: FIM_MAX_TOKENS,
      temperature: 0,
    };
    const id = ++sequence;
    const controller = new AbortController();
    inFlight = controller;
    const sent = performance.now();
    try {
      const answer = await callApi("/v1/fim/completions", body, controller.signal);
      if (id !== sequence || editor.caret !== at || editor.textarea.value !== value) return;
      editor.show(answer.choices[0].text, at);
      const shown = performance.now();
      const usage = answer.usage;
      const seconds = (shown - sent) / 1000;
      stats.dataset.latencyMs = (shown - typedAt).toFixed(1);
      stats.dataset.roundTripMs = (shown - sent).toFixed(1);
      stats.dataset.sequence = String(id);
      stats.textContent =
        `${Math.round(shown - typedAt)} ms key to suggestion · ` +
        `${usage.cached_input_tokens}/${usage.prompt_tokens} prompt tokens cached · ` +
        `${usage.completion_tokens} tokens, ${(usage.completion_tokens / seconds).toFixed(0)} tok/s`;
      showError(error, null);
    } catch (failure) {
      if (!isAbort(failure)) showError(error, failure);
    } finally {
      if (inFlight === controller) inFlight = null;
    }
  }

  editor.textarea.addEventListener("input", (event) => {
    const typedAt = performance.now();
    cancel();
    const inserted = event.inputType === "insertText" ? event.data : null;
    if (!editor.typedAlong(inserted)) editor.clear();
    editor.render();
    timer = setTimeout(() => suggest(typedAt), FIM_DEBOUNCE_MS);
  });
  editor.textarea.addEventListener("keydown", (event) => {
    if (event.key === "Tab" && !event.shiftKey) {
      event.preventDefault();
      if (editor.accept()) {
        cancel();
        stats.textContent = "accepted";
      } else {
        editor.textarea.setRangeText("    ", editor.textarea.selectionStart,
          editor.textarea.selectionEnd, "end");
        editor.textarea.dispatchEvent(new InputEvent("input", { inputType: "insertText" }));
      }
    } else if (event.key === "Escape") {
      cancel();
      editor.clear();
    }
  });
  // A caret moved by click or arrow keys leaves the suggestion behind.
  const followCaret = () => {
    if (editor.ghost && editor.caret !== editor.anchor) {
      cancel();
      editor.clear();
    }
  };
  editor.textarea.addEventListener("click", followCaret);
  editor.textarea.addEventListener("keyup", followCaret);
}

// --- next edit ---------------------------------------------------------------------------

// Continue's next-edit prompt (../shared/clients.md): the file with the cursor and the region
// marked, and the edits made so far as unified diffs.
function nextEditPrompt(text, cursor, history) {
  const lines = text.split("\n");
  const cursorLine = text.slice(0, cursor).split("\n").length - 1;
  const first = cursorLine;
  const last = Math.min(lines.length, first + EDIT_REGION_LINES);
  const lineStart = text.slice(0, cursor).lastIndexOf("\n") + 1;
  const column = cursor - lineStart;
  const region = lines.slice(first, last);
  const marked = [...region];
  marked[0] = `${region[0].slice(0, column)}<|cursor|>${region[0].slice(column)}`;
  const file = [
    ...lines.slice(0, first),
    "<|code_to_edit|>",
    ...marked,
    "<|/code_to_edit|>",
    ...lines.slice(last),
  ].join("\n");
  const prompt =
    "<|recently_viewed_code_snippets|>\n\n<|/recently_viewed_code_snippets|>\n\n" +
    `<|current_file_content|>\ncurrent_file_path: ${FILE_NAME}\n${file}\n` +
    "<|/current_file_content|>\n\n" +
    `<|edit_diff_history|>\n${history.join("\n")}\n<|/edit_diff_history|>\n`;
  return { prompt, first, last, region: region.join("\n") };
}

// The region the answer proposes: between the first "```\n" and the last "\n```", as
// Continue reads it; null when the answer has no such fence.
function fencedRegion(content) {
  const open = content.indexOf("```\n");
  const close = content.lastIndexOf("\n```");
  if (open < 0 || close < open + 3) return null;
  return content.slice(open + 4, close);
}

function setupNextEdit() {
  const textarea = $("edit-text");
  const diffView = $("edit-diff");
  const stats = $("edit-stats");
  const error = $("edit-error");
  const history = [];
  let snapshot = textarea.value;
  let pause = null;
  let inFlight = null;
  let suggestion = null; // {text, first, last, region, replacement}

  const drop = () => {
    suggestion = null;
    diffView.replaceChildren();
  };

  function recordEdit() {
    const diff = unifiedDiff(snapshot, textarea.value);
    snapshot = textarea.value;
    if (!diff) return false;
    history.push(diff);
    if (history.length > EDIT_MAX_DIFFS) history.shift();
    return true;
  }

  async function suggest() {
    clearTimeout(pause);
    recordEdit();
    if (inFlight) inFlight.abort();
    const controller = new AbortController();
    inFlight = controller;
    const text = textarea.value;
    const request = nextEditPrompt(text, textarea.selectionEnd, history);
    const started = performance.now();
    stats.textContent = `edits so far: ${history.length} · asking...`;
    try {
      const body = {
        model: modelFor("edit"),
        messages: [{ role: "user", content: request.prompt }],
        max_tokens: 256,
        temperature: 0,
      };
      const answer = await callApi("/v1/edit/completions", body, controller.signal);
      if (textarea.value !== text) return;
      const seconds = ((performance.now() - started) / 1000).toFixed(2);
      stats.textContent = `edits so far: ${history.length} · answered in ${seconds} s`;
      showError(error, null);
      const replacement = fencedRegion(answer.choices[0].message.content);
      if (replacement === null || replacement === request.region) {
        drop();
        renderDiff(diffView, [], "no change suggested");
        return;
      }
      suggestion = { text, ...request, replacement };
      renderDiff(diffView, lineDiff(request.region, replacement), "Tab accepts");
    } catch (failure) {
      if (!isAbort(failure)) showError(error, failure);
    } finally {
      if (inFlight === controller) inFlight = null;
    }
  }

  function accept() {
    if (!suggestion || textarea.value !== suggestion.text) return false;
    const lines = textarea.value.split("\n");
    lines.splice(suggestion.first, suggestion.last - suggestion.first, suggestion.replacement);
    textarea.value = lines.join("\n");
    drop();
    recordEdit();
    stats.textContent = `edits so far: ${history.length} · accepted`;
    return true;
  }

  textarea.addEventListener("input", () => {
    drop();
    clearTimeout(pause);
    pause = setTimeout(suggest, EDIT_PAUSE_MS);
  });
  textarea.addEventListener("keydown", (event) => {
    if (event.key === "Tab" && suggestion) {
      event.preventDefault();
      accept();
    }
  });
  $("edit-suggest").addEventListener("click", suggest);
}

// --- apply -------------------------------------------------------------------------------

function setupApply() {
  const stats = $("apply-stats");
  const error = $("apply-error");
  const diffView = $("apply-diff");
  $("apply-run").addEventListener("click", async () => {
    const original = $("apply-original").value;
    const snippet = $("apply-snippet").value;
    const content =
      `<|original_code|>\n${original}\n<|/original_code|>\n\n` +
      `<|update_snippet|>\n${snippet}\n<|/update_snippet|>`;
    diffView.replaceChildren();
    stats.textContent = "merging...";
    const started = performance.now();
    try {
      const body = { model: modelFor("apply"), messages: [{ role: "user", content }] };
      const answer = await callApi("/v1/apply/completions", body);
      const text = answer.choices[0].message.content;
      const merged = text.replace(/^<\|updated_code\|>\n/, "").replace(/\n<\|\/updated_code\|>$/, "");
      renderDiff(diffView, lineDiff(original, merged));
      stats.textContent = `merged in ${((performance.now() - started) / 1000).toFixed(2)} s`;
      showError(error, null);
    } catch (failure) {
      stats.textContent = "";
      showError(error, failure);
    }
  });
}

// --- decisions ---------------------------------------------------------------------------

function probabilityBar(label, probability, chosen) {
  const name = document.createElement("span");
  name.textContent = label;
  const bar = document.createElement("div");
  bar.className = chosen ? "bar chosen" : "bar";
  const fill = document.createElement("div");
  fill.className = "fill";
  fill.style.width = `${(probability * 100).toFixed(1)}%`;
  const value = document.createElement("span");
  value.className = "value";
  value.textContent = probability.toFixed(3);
  bar.append(fill, value);
  return [name, bar];
}

function renderAnswer(name, answer) {
  const box = document.createElement("div");
  box.className = "answer";
  box.dataset.question = name;
  const title = document.createElement("h3");
  if (answer.type === "noul") {
    title.textContent = `${name}: noul ${answer.noul.toFixed(3)} (${answer.noul >= 0.5 ? "yes" : "no"})`;
    box.append(title, ...probabilityBar("yes", answer.noul, answer.noul >= 0.5));
    return box;
  }
  const picked = answer.type === "choice" ? answer.choice : null;
  title.textContent = answer.type === "choice"
    ? `${name}: ${answer.choice} (confidence ${answer.confidence.toFixed(3)})`
    : `${name}: score ${answer.score.toFixed(2)} (confidence ${answer.confidence.toFixed(3)})`;
  box.append(title);
  for (const [option, probability] of Object.entries(answer.probabilities)) {
    const label = answer.type === "score" ? `${option}: ${answer.legend[option]}` : option;
    const nearest = answer.type === "score" && Number(option) === Math.round(answer.score);
    box.append(...probabilityBar(label, probability, option === picked || nearest));
  }
  return box;
}

function setupDecisions() {
  const stats = $("decisions-stats");
  const error = $("decisions-error");
  const answers = $("decisions-answers");
  $("decisions-run").addEventListener("click", async () => {
    answers.replaceChildren();
    let body;
    try {
      body = JSON.parse($("decisions-body").value);
      body.model = modelFor("decisions");
    } catch (failure) {
      showError(error, failure);
      return;
    }
    stats.textContent = "deciding...";
    const started = performance.now();
    try {
      const response = await callApi("/v1/decisions", body);
      for (const [name, answer] of Object.entries(response.answers)) {
        answers.append(renderAnswer(name, answer));
      }
      const seconds = ((performance.now() - started) / 1000).toFixed(2);
      stats.textContent = `${seconds} s · ${response.usage.input_tokens} input tokens`;
      showError(error, null);
    } catch (failure) {
      stats.textContent = "";
      showError(error, failure);
    }
  });
}

// --- chat --------------------------------------------------------------------------------

function setupChat() {
  const log = $("chat-log");
  const input = $("chat-text");
  const stats = $("chat-stats");
  const error = $("chat-error");
  const messages = [];
  let inFlight = null;

  const bubble = (role, text) => {
    const element = document.createElement("div");
    element.className = `message ${role}`;
    element.textContent = text;
    log.append(element);
    return element;
  };

  $("chat-send").addEventListener("click", async () => {
    const text = input.value.trim();
    if (!text || inFlight) return;
    input.value = "";
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const reply = bubble("assistant", "");
    const controller = new AbortController();
    inFlight = controller;
    const started = performance.now();
    let firstAt = null;
    let usage = null;
    try {
      const body = {
        model: modelFor("chat"),
        messages,
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 512,
      };
      for await (const chunk of streamApi("/v1/chat/completions", body, controller.signal)) {
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices.length ? chunk.choices[0].delta.content : null;
        if (!delta) continue;
        firstAt = firstAt ?? performance.now();
        reply.textContent += delta;
      }
      showError(error, null);
    } catch (failure) {
      if (!isAbort(failure)) showError(error, failure);
    } finally {
      inFlight = null;
      messages.push({ role: "assistant", content: reply.textContent });
      const total = (performance.now() - started) / 1000;
      const first = firstAt === null ? "-" : ((firstAt - started) / 1000).toFixed(2);
      stats.textContent = usage
        ? `first token ${first} s · ${usage.completion_tokens} tokens in ${total.toFixed(2)} s`
        : `stopped after ${total.toFixed(2)} s`;
    }
  });
  $("chat-stop").addEventListener("click", () => inFlight && inFlight.abort());
}

document.addEventListener("DOMContentLoaded", () => {
  setupKey();
  setupTabs();
  setupFim();
  setupNextEdit();
  setupApply();
  setupDecisions();
  setupChat();
  loadModels();
});
