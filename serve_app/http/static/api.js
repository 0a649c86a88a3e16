// The API as the page calls it: the key of this tab, JSON calls, streamed answers, and the
// contract's errors shown as they were sent. The key lives in this tab's sessionStorage and
// goes only into the Authorization header of same-origin calls.
const KEY_STORAGE = "serve-app.api-key";

export const $ = (id) => document.getElementById(id);
export const session = { key: sessionStorage.getItem(KEY_STORAGE) || "", models: {} };

export function rememberKey(key) {
  session.key = key;
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

export class ApiError extends Error {
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

export async function callApi(path, body, signal) {
  const response = await fetch(path, requestInit(body, signal));
  const parsed = await parsedBody(response);
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

// Server-sent events of a streamed answer: yields each chunk until `data: [DONE]`; an error
// event (a stream that failed after it began) is thrown as the contract's error object.
export async function* streamApi(path, body, signal) {
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

export function showError(element, error) {
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

export const isAbort = (error) => error && error.name === "AbortError";

export function modelFor(endpoint) {
  const model = session.models[endpoint];
  if (!model) throw new Error(`No model for ${endpoint}: paste a key that may use one.`);
  return model;
}
