// FIM: ghost text in the code pane, asked for at each keystroke.
import { $, callApi, isAbort, modelFor, showError } from "./api.js";

const FIM_DEBOUNCE_MS = 40;
// One line, at most 16 tokens: what Zed and Continue ask for at a keystroke (bench.keystroke).
const FIM_MAX_TOKENS = 16;
const FIM_STOP = ["\n"];

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

export function setupFim() {
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
      stop: FIM_STOP,
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
