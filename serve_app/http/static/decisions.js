// Decisions: a state and named questions give answers with their probabilities as bars.
import { $, callApi, modelFor, showError } from "./api.js";

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

export function setupDecisions() {
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
