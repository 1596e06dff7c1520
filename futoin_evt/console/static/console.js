// futoin-evt console: a page's table refreshes itself, a live tail follows its stream.
"use strict";

// <main data-refresh="N">: fetch the page again every N seconds and swap its content,
// unless the user is typing in one of its fields.
function refresh(main) {
  const seconds = Number(main.dataset.refresh);
  setInterval(async () => {
    if (document.hidden || main.contains(document.activeElement) && document.activeElement.tagName === "INPUT") {
      return;
    }
    const reply = await fetch(location.href, { credentials: "same-origin" });
    if (!reply.ok || reply.redirected) {
      return;
    }
    const page = new DOMParser().parseFromString(await reply.text(), "text/html");
    const fresh = page.getElementById("main");
    if (fresh) {
      main.replaceChildren(...fresh.childNodes);
    }
  }, seconds * 1000);
}

// <table id="tail" data-source="URL" data-rows="N">: one row per notification, newest on
// top, at most N rows. Text only (textContent): nothing the events hold becomes markup.
function follow(table) {
  const body = table.tBodies[0];
  const keep = Number(table.dataset.rows);
  const state = document.getElementById("tail-state");
  const source = new EventSource(table.dataset.source);
  source.onopen = () => {
    table.dataset.state = "live";
    state.textContent = "following";
  };
  source.onerror = () => {
    table.dataset.state = "reconnecting";
    state.textContent = "reconnecting…";
  };
  source.onmessage = (event) => {
    for (const item of JSON.parse(event.data)) {
      const row = body.insertRow(0);
      row.className = "new";
      const shown = item.message.body !== undefined && item.message.properties === undefined
        ? item.message.body : (item.message.properties || item.message);
      for (const value of [item.id ?? "", item.type, item.ts, JSON.stringify(shown)]) {
        row.insertCell().textContent = String(value);
      }
      row.cells[0].className = "num";
      row.cells[2].className = "ts";
    }
    while (body.rows.length > keep) {
      body.deleteRow(-1);
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("main");
  if (main && main.dataset.refresh) {
    refresh(main);
  }
  const tail = document.getElementById("tail");
  if (tail) {
    follow(tail);
  }
});
