// The JSON API with the bearer token the operator pasted once (kept in localStorage).

const TOKEN_KEY = "clusterwarden.token";

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function getToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  localStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  localStorage.removeItem(TOKEN_KEY);
}

/** What an error says: the API answers problem details (RFC 9457), whose `detail` says what
 * went wrong; an invalid template's `problems` say it field by field. */
export function detailText(body, fallback) {
  if (body && Array.isArray(body.problems) && body.problems.length) {
    return body.problems.map((p) => `${p.field}: ${p.message}`).join("; ");
  }
  const detail = body && (body.detail || body.title);
  return typeof detail === "string" && detail ? detail : fallback;
}

const STATUS_TEXT = {
  400: "Bad request", 401: "Not signed in", 403: "Forbidden", 404: "Not found",
  409: "Refused", 422: "Invalid", 500: "Server error", 503: "Unavailable",
};

// Listeners for a 401: the token was revoked or mistyped, so the console asks for it again.
const unauthorised = new Set();
export function onUnauthorised(fn) {
  unauthorised.add(fn);
}

/** One request; resolves with the parsed JSON, rejects with an ApiError (status 0: network). */
export async function request(method, path, body, { signal } = {}) {
  const headers = { Accept: "application/json, application/problem+json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `the API did not answer (${err.message})`, null);
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try { data = JSON.parse(text); } catch { data = { detail: text.slice(0, 300) }; }
  }
  if (!response.ok) {
    const message = detailText(data, STATUS_TEXT[response.status] || response.statusText);
    const err = new ApiError(response.status, message, data);
    if (response.status === 401) for (const fn of unauthorised) fn(err);
    throw err;
  }
  return data;
}

export const get = (path, opts) => request("GET", path, undefined, opts);
export const post = (path, body, opts) => request("POST", path, body, opts);

/** "/api/v1/tasks?state=running&node=n1" from a path and the non-empty parameters. */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(key, String(value));
  }
  const text = q.toString();
  return text ? `${path}?${text}` : path;
}

/** "409 Refused: cannot resume a task that is running: ..." */
export function errorLine(err) {
  if (!(err instanceof ApiError)) return String(err && err.message ? err.message : err);
  if (err.status === 0) return err.message;
  return `${err.status} ${STATUS_TEXT[err.status] || ""}: ${err.message}`.replace(" :", ":");
}

/** Fetch `path` with the session's token and save it as `filename` (a link alone would not
 * carry the token). */
export async function download(path, filename) {
  const headers = {};
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (!response.ok) {
    const err = new ApiError(response.status, STATUS_TEXT[response.status] || response.statusText, null);
    if (response.status === 401) for (const fn of unauthorised) fn(err);
    throw err;
  }
  const url = URL.createObjectURL(await response.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
