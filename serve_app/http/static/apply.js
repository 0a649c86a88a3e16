// Apply: an original and an update snippet give the merged file, drawn as a diff.
import { $, callApi, modelFor, showError } from "./api.js";
import { lineDiff, renderDiff } from "./diff.js";

export function setupApply() {
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
