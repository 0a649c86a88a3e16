// Next edit: the page keeps the edits made in it as diffs and asks where the next one goes.
import { $, callApi, isAbort, modelFor, showError } from "./api.js";
import { lineDiff, renderDiff, unifiedDiff } from "./diff.js";

const FILE_NAME = "playground.py";
const EDIT_PAUSE_MS = 600;
const EDIT_REGION_LINES = 6; // Continue's: the cursor line and the 5 after it
const EDIT_MAX_DIFFS = 6;

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

export function setupNextEdit() {
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
    const diff = unifiedDiff(FILE_NAME, snapshot, textarea.value);
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
