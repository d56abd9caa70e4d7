// Hash routes: "#/task/abc?x=1" is the page "task" with the argument "abc" and parameters x=1.

/** "#/task/abc?x=1" -> {name: "task", arg: "abc", params: URLSearchParams} */
export function parseHash(hash = location.hash) {
  const text = hash.replace(/^#\/?/, "");
  const [path, query = ""] = text.split("?");
  const [name = "", ...rest] = path.split("/");
  const arg = rest.join("/");
  return { name: name || "tasks", arg: arg ? decodeURIComponent(arg) : "", params: new URLSearchParams(query) };
}

/** Change the hash's parameters without re-mounting the page (filters, selections). */
export function replaceParams(name, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const text = q.toString();
  history.replaceState(null, "", `#/${name}${text ? `?${text}` : ""}`);
}
