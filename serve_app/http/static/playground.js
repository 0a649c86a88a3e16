// The playground: every endpoint of the API in one page, with the key the user pastes. No
// framework and no build step: one ES module per tab (modules are strict and deferred). Every text from the server is shown with
// textContent, never parsed as HTML.
import { $, ApiError, callApi, rememberKey, session } from "./api.js";
import { setupApply } from "./apply.js";
import { setupChat } from "./chat.js";
import { setupDecisions } from "./decisions.js";
import { setupNextEdit } from "./edit.js";
import { setupFim } from "./fim.js";

const LISTINGS = {
  fim: "/v1/fim/completions/models",
  edit: "/v1/edit/completions/models",
  apply: "/v1/apply/completions/models",
  decisions: "/v1/decisions/models",
  chat: "/v1/chat/completions/models",
};

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

function setupKey() {
  const input = $("api-key");
  $("use-key").addEventListener("click", () => {
    rememberKey(input.value.trim());
    input.value = "";
    loadModels();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") $("use-key").click();
  });
  $("forget-key").addEventListener("click", () => {
    rememberKey("");
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
