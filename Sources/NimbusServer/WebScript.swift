import Crypto
import Foundation

/// The web view's one script, `/web/app.js` (docs/web.md): uploads with progress (a file
/// picker, a folder picker, drag and drop) and live refresh of the page when its container
/// changes. Pages work without it (browsing, downloading, every form); it only adds. It builds
/// every piece of text with `textContent`, never markup.
enum WebScript {
    /// A digest of the script, in its address (`/web/app.js?v=…`).
    static let version = digest(source)

    static func digest(_ text: String) -> String {
        SHA256.hash(data: Data(text.utf8)).prefix(6).map { String(format: "%02x", $0) }.joined()
    }

    static let source = #"""
"use strict";
(function () {
  const main = document.querySelector("main");
  if (!main) return;
  const csrfField = document.querySelector("input[name=csrf]");
  const csrf = csrfField ? csrfField.value : "";

  // --- Live refresh: wait for the container's next change, then read the page again and put
  // its live part (`#live`) in place of this one's; not while the user types into a field of it
  // (then as soon as they leave it). An upload's list stays.
  function editing() {
    const a = document.activeElement;
    return !!a && a.tagName === "INPUT" && a.type === "text" && a.value !== a.defaultValue;
  }
  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
  async function refresh() {
    const r = await fetch(location.href, { credentials: "same-origin", cache: "no-store", headers: { "X-Nimbus-Refresh": "1" } });
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    const fresh = doc.getElementById("live"), here = document.getElementById("live");
    const freshMain = doc.querySelector("main");
    if (r.status === 401 && doc.getElementById("code")) {
      // Signed out meanwhile (idle, revoked): the sign-in page the server answered, with its reason.
      document.replaceChild(document.adoptNode(doc.documentElement), document.documentElement);
      return false;
    }
    if (!r.ok || r.redirected || !fresh || !here || !freshMain || freshMain.dataset.watch !== main.dataset.watch) {
      location.reload();
      return false;
    }
    here.replaceWith(document.adoptNode(fresh));
    main.dataset.cursor = freshMain.dataset.cursor;
    main.dataset.refreshed = String(Number(main.dataset.refreshed || "0") + 1);
    return true;
  }
  async function watch(url) {
    let changed = false;
    for (;;) {
      if (changed) {
        if (editing()) { await sleep(500); continue; }
        changed = false;
        try { if (!(await refresh())) return; } catch (e) { await sleep(5000); }
        continue;
      }
      try {
        const since = Number(main.dataset.cursor || "0");
        const r = await fetch(url + "?since=" + since, { credentials: "same-origin", cache: "no-store" });
        if (r.status === 401) { location.reload(); return; }
        if (!r.ok) { await sleep(5000); continue; }
        const answer = await r.json();
        if (answer.cursor > since) changed = true;
      } catch (e) {
        await sleep(5000);
      }
    }
  }
  if (main.dataset.watch) {
    main.dataset.live = "on";
    watch(main.dataset.watch);
  }

  // --- Upload: each file streamed in one request (the server cuts it into chunks and commits
  // it), one after the other; the folders of an uploaded folder made first.
  const panel = document.getElementById("upload");
  if (!panel || !main.dataset.upload) return;
  panel.hidden = false;
  const list = document.getElementById("uploads");
  const total = document.getElementById("upload-progress");
  const summary = document.getElementById("upload-state");

  function row(path, size) {
    const li = document.createElement("li");
    const name = document.createElement("bdi");
    name.textContent = path;
    const bar = document.createElement("progress");
    bar.max = Math.max(size, 1);
    bar.value = 0;
    const state = document.createElement("span");
    state.className = "state";
    state.textContent = "waiting";
    li.append(name, " ", bar, " ", state);
    list.append(li);
    return { li, bar, state };
  }

  function send(url, body, onProgress) {
    return new Promise((done) => {
      const x = new XMLHttpRequest();
      x.open("POST", url);
      x.setRequestHeader("X-Nimbus-CSRF", csrf);
      x.setRequestHeader("Content-Type", "application/octet-stream");
      if (onProgress) x.upload.onprogress = (e) => onProgress(e.loaded);
      x.onload = () => {
        let answer = {};
        try { answer = JSON.parse(x.responseText); } catch (e) { answer = { error: "the server answered " + x.status }; }
        const why = x.status === 413 ? "a proxy in front of the server refused a file this large (its body size limit; dist/nginx/nimbus.conf lifts it for uploads)"
          : "the server answered " + x.status;
        done(x.status === 200 ? answer : { error: answer.error || why });
      };
      x.onerror = () => done({ error: "the connection to the server was lost; nothing of this file was committed — try again" });
      x.send(body);
    });
  }

  async function uploadAll(entries) {
    if (entries.length === 0) return;
    const base = main.dataset.upload;
    const folders = new Map([["", main.dataset.folder || ""]]);
    const files = entries.filter((e) => e.file);
    const bytes = files.reduce((n, e) => n + e.file.size, 0);
    let done = 0, failed = 0;
    panel.dataset.state = "uploading";
    total.max = Math.max(bytes, 1);
    total.value = 0;
    summary.textContent = "uploading " + files.length + " file" + (files.length === 1 ? "" : "s");
    const rows = files.map((e) => row(e.path, e.file.size));
    async function folderOf(path) {
      const cut = path.lastIndexOf("/");
      const dir = cut < 0 ? "" : path.slice(0, cut);
      if (folders.has(dir)) return folders.get(dir);
      const parent = await folderOf(dir);
      if (parent === null) return null;
      const name = dir.slice(dir.lastIndexOf("/") + 1);
      const a = await send(base + "?kind=folder&folder=" + encodeURIComponent(parent) + "&name=" + encodeURIComponent(name), null, null);
      const id = a.error ? null : a.id;
      folders.set(dir, id);
      return id;
    }
    for (const e of entries.filter((e) => !e.file)) await folderOf(e.path + "/x");
    for (let i = 0; i < files.length; i++) {
      const e = files[i], r = rows[i];
      const folder = await folderOf(e.path);
      let a;
      if (folder === null) {
        a = { error: "its folder could not be made" };
      } else {
        r.state.textContent = "uploading";
        const name = e.path.slice(e.path.lastIndexOf("/") + 1);
        a = await send(base + "?folder=" + encodeURIComponent(folder) + "&name=" + encodeURIComponent(name), e.file, (n) => {
          r.bar.value = n;
          total.value = done + n;
        });
      }
      if (a.error) {
        failed++;
        r.li.className = "failed";
        r.state.textContent = "failed: " + a.error;
      } else {
        r.bar.value = r.bar.max;
        r.li.className = "done";
        r.state.textContent = a.renamed ? "done, as " + a.name + " (the name was taken)" : "done";
      }
      done += e.file.size;
      total.value = done;
    }
    summary.textContent = failed === 0 ? "uploaded " + files.length + " file" + (files.length === 1 ? "" : "s")
      : (files.length - failed) + " of " + files.length + " files uploaded; " + failed + " failed (see below)";
    panel.dataset.state = failed === 0 ? "done" : "failed";
  }

  const pick = document.getElementById("upload-files");
  pick.addEventListener("change", () => {
    uploadAll([...pick.files].map((f) => ({ file: f, path: f.name })));
    pick.value = "";
  });
  const pickFolder = document.getElementById("upload-folder");
  pickFolder.addEventListener("change", () => {
    uploadAll([...pickFolder.files].map((f) => ({ file: f, path: f.webkitRelativePath || f.name })));
    pickFolder.value = "";
  });

  // Drag and drop: files and whole folders (walked through the entries API).
  async function walk(entry, path, out) {
    if (entry.isFile) {
      const file = await new Promise((ok, fail) => entry.file(ok, fail));
      out.push({ file, path });
    } else if (entry.isDirectory) {
      out.push({ file: null, path });
      const reader = entry.createReader();
      for (;;) {
        const batch = await new Promise((ok, fail) => reader.readEntries(ok, fail));
        if (batch.length === 0) break;
        for (const child of batch) await walk(child, path + "/" + child.name, out);
      }
    }
  }
  document.addEventListener("dragover", (e) => { e.preventDefault(); panel.classList.add("drop"); });
  document.addEventListener("dragleave", () => panel.classList.remove("drop"));
  document.addEventListener("drop", async (e) => {
    e.preventDefault();
    panel.classList.remove("drop");
    const items = [...(e.dataTransfer.items || [])].map((i) => i.webkitGetAsEntry && i.webkitGetAsEntry()).filter(Boolean);
    const out = [];
    if (items.length > 0) {
      for (const entry of items) await walk(entry, entry.name, out);
    } else {
      for (const f of e.dataTransfer.files) out.push({ file: f, path: f.name });
    }
    uploadAll(out);
  });
})();
"""#
}
