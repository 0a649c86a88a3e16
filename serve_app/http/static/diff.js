// Line diffs: what the next-edit and apply tabs draw, and the history next-edit sends.
// [kind, line] pairs, kind " ", "-" or "+": the common head and tail are cut first, then the
// longest common subsequence of what is left.
export function lineDiff(before, after) {
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

export function renderDiff(element, rows, note) {
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
export function unifiedDiff(path, before, after, context = 2) {
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
  return [`--- ${path}`, `+++ ${path}`, header, ...lines].join("\n");
}
