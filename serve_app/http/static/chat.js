// Chat: streamed answers, and tool calls drawn as they stream.
import { $, isAbort, modelFor, showError, streamApi } from "./api.js";

const MAX_TOKENS = 512;

// The tool calls of a streamed answer, drawn as `name(arguments)` lines as their pieces come:
// a call's first piece has its index and name, the next ones pieces of its arguments.
class ToolCalls {
  constructor(reply) {
    this.reply = reply;
    this.lines = new Map();
  }

  add(deltas) {
    for (const delta of deltas) {
      let call = this.lines.get(delta.index);
      if (!call) {
        call = { name: "", arguments: "", line: document.createElement("span") };
        call.line.className = "call";
        this.reply.append(call.line);
        this.lines.set(delta.index, call);
      }
      if (delta.function && delta.function.name) call.name += delta.function.name;
      if (delta.function && delta.function.arguments) call.arguments += delta.function.arguments;
      call.line.textContent = `→ ${call.name}(${call.arguments})`;
    }
  }
}

export function setupChat() {
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

  // The tools offered, when the box is ticked: {tools, tool_choice}, or {} (none).
  const toolOptions = () => {
    if (!$("chat-use-tools").checked) return {};
    return { tools: JSON.parse($("chat-tools").value), tool_choice: $("chat-tool-choice").value };
  };

  $("chat-send").addEventListener("click", async () => {
    const text = input.value.trim();
    if (!text || inFlight) return;
    let tools;
    try {
      tools = toolOptions();
    } catch (failure) {
      showError(error, failure);
      return;
    }
    input.value = "";
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const reply = bubble("assistant", "");
    const calls = new ToolCalls(reply);
    const controller = new AbortController();
    inFlight = controller;
    const started = performance.now();
    let firstAt = null;
    let usage = null;
    let finish = null;
    try {
      const body = {
        model: modelFor("chat"),
        messages,
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: MAX_TOKENS,
        ...tools,
      };
      for await (const chunk of streamApi("/v1/chat/completions", body, controller.signal)) {
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices.length ? chunk.choices[0] : null;
        if (choice && choice.finish_reason) finish = choice.finish_reason;
        const delta = choice ? choice.delta : null;
        if (!delta || !(delta.content || delta.tool_calls)) continue;
        firstAt = firstAt ?? performance.now();
        if (delta.content) reply.append(delta.content);
        if (delta.tool_calls) calls.add(delta.tool_calls);
      }
      showError(error, null);
    } catch (failure) {
      if (!isAbort(failure)) showError(error, failure);
    } finally {
      inFlight = null;
      messages.push({ role: "assistant", content: reply.textContent });
      const total = (performance.now() - started) / 1000;
      const first = firstAt === null ? "-" : ((firstAt - started) / 1000).toFixed(2);
      // An answer cut at max_tokens says so: its last tool call's arguments may be unfinished.
      const cut = finish === "length" ? ` · cut at max_tokens (${MAX_TOKENS})` : "";
      stats.textContent = usage
        ? `first token ${first} s · ${usage.completion_tokens} tokens in ${total.toFixed(2)} s${cut}`
        : `stopped after ${total.toFixed(2)} s`;
    }
  });
  $("chat-stop").addEventListener("click", () => inFlight && inFlight.abort());
}
